"""Measure the diffusion models' quality figures with the judge (one command).

    .venv/bin/python -m training.diffusion.evaluate [--models DDPM,DDIM,CLS_COND_DDIM,LDM]
        [--samples 200] [--seed 1234] [--scheduler NAME] [--steps N] [--batch 50]
        [--threads 1] [--no-grid] [--no-record]

Each model is built exactly as a server builds it (``conf/model/diffusion/<name>.toml``
through the registry) and sampled through :meth:`Model.run` (PNG round trip
included) at its default scheduler and steps, or at ``--scheduler`` / ``--steps``.
Per model it prints the judge's mean top-1 confidence, the share of samples above
0.9, the class histogram, for CLS_COND_DDIM the agreement with the requested
``class_id`` (``samples / 10`` per class), for LDM the autoencoder's held-out
reconstruction error, and the sampling time per image (batches of ``--batch`` images,
one run each). It writes ``docs/img/<model>_grid.png`` (default scheduler only) and
stores the figures in the pipeline's ``manifest.json`` under ``figures`` (unless
``--no-grid`` / ``--no-record``; the manifest's own file is not part of the hashed
pipeline files).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mortred_twisted.model_api.base import InferenceRequest, ModelLoadError, RunContext
from mortred_twisted.models.diffusion.judge import DigitJudge
from mortred_twisted.models.diffusion.manifest import sha256_file
from mortred_twisted.models.registry import create_model

ROOT = Path(__file__).resolve().parents[2]
JUDGE = ROOT / "weights" / "diffusion" / "judge.pt"
JUDGE_MANIFEST = ROOT / "weights" / "diffusion" / "manifest.json"
CONFIGS = {
    "DDPM": "conf/model/diffusion/ddpm.toml",
    "DDIM": "conf/model/diffusion/ddim.toml",
    "CLS_COND_DDIM": "conf/model/diffusion/cls_cond_ddim.toml",
    "LDM": "conf/model/diffusion/ldm.toml",
}


def load_judge() -> DigitJudge:
    """The judge CNN, checked against its sha256 in weights/diffusion/manifest.json."""
    entry = json.loads(JUDGE_MANIFEST.read_text())["files"]["judge.pt"]
    if sha256_file(JUDGE) != entry["sha256"]:
        raise ModelLoadError(f"{JUDGE}: sha256 mismatch with {JUDGE_MANIFEST}")
    net = DigitJudge(**entry["arch"])
    net.load_state_dict(torch.load(JUDGE, map_location="cpu", weights_only=True))
    return net.eval()


def model_options(name: str) -> dict[str, Any]:
    return tomllib.loads((ROOT / CONFIGS[name]).read_text())


def decode_pngs(images: Sequence[str]) -> np.ndarray:
    out = []
    for b64 in images:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            out.append(np.asarray(img.convert("L"), dtype=np.float32) / 255.0)
    return np.stack(out)


@torch.no_grad()
def judge_scores(judge: DigitJudge, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(predicted class, top-1 probability)`` for ``(N, H, W)`` pixels in [0, 1]."""
    x = torch.from_numpy(pixels).unsqueeze(1) * 2.0 - 1.0
    probs = torch.softmax(judge(x), dim=1)
    conf, pred = probs.max(dim=1)
    return pred.numpy(), conf.numpy()


def save_grid(pixels: np.ndarray, path: str, cols: int = 10, scale: int = 3) -> None:
    n = (len(pixels) // cols) * cols
    rows = n // cols
    h, w = pixels.shape[1:]
    grid = np.zeros((rows * (h + 1) + 1, cols * (w + 1) + 1), dtype=np.uint8) + 64
    for i in range(n):
        r, c = divmod(i, cols)
        tile = (pixels[i] * 255).round().astype(np.uint8)
        grid[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = tile
    img = Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale), 0)
    (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
    img.save(ROOT / path)
    print(f"wrote {path}")


def evaluate_model(
    name: str,
    samples: int,
    seed: int,
    batch: int,
    judge: DigitJudge,
    grid: bool,
    *,
    scheduler: str | None = None,
    steps: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sample ``samples`` images of model ``name`` and score them with ``judge``."""
    options = dict(options or model_options(name))
    # The served bound on num_images is for requests; evaluation batches more at once.
    options["max_images"] = max(int(options.get("max_images", 16)), batch)
    options["device"] = "cpu"
    model = create_model(name, options, ROOT)
    extra: dict[str, Any] = {}
    if scheduler is not None:
        extra["scheduler"] = scheduler
    if steps is not None:
        extra["sample_steps"] = steps
    jobs: list[dict[str, Any]] = []
    if name == "CLS_COND_DDIM":
        per_class = max(1, samples // 10)
        for cls in range(10):
            for start in range(0, per_class, batch):
                n = min(batch, per_class - start)
                jobs.append({"class_id": cls, "num_images": n, "seed": seed + 100 * cls + start})
    else:
        for start in range(0, samples, batch):
            jobs.append({"num_images": min(batch, samples - start), "seed": seed + start})
    pixels, requested = [], []
    data: dict[str, Any] = {}
    begin = time.monotonic()
    for i, params in enumerate(jobs):
        req = model.validate(InferenceRequest(req_id=f"eval-{i}", params={**params, **extra}))
        data = model.run(req, RunContext())
        pixels.append(decode_pngs(data["images"]))
        requested += [params.get("class_id", -1)] * len(data["images"])
    seconds = time.monotonic() - begin
    px = np.concatenate(pixels)
    pred, conf = judge_scores(judge, px)
    hist = np.bincount(pred, minlength=10).tolist()
    fig: dict[str, Any] = {
        "samples": len(px),
        "scheduler": data["scheduler"],
        "steps": data["steps"],
        "seed": seed,
        "mean_confidence": round(float(conf.mean()), 4),
        "share_confidence_above_0.9": round(float((conf > 0.9).mean()), 4),
        "class_histogram": hist,
        "classes_present": int(sum(1 for h in hist if h > 0)),
        "sampling_seconds": round(seconds, 1),
        "seconds_per_image": round(seconds / len(px), 4),
        "batch": batch,
        "threads": torch.get_num_threads(),
    }
    if name == "CLS_COND_DDIM":
        req = np.array(requested)
        fig["agreement"] = round(float((pred == req).mean()), 4)
        fig["per_class_agreement"] = [
            round(float((pred[req == c] == c).mean()), 3) for c in range(10)
        ]
    if name == "LDM":
        ae = model.instance.pipe.manifest.get("training", {}).get("autoencoder", {})
        fig["autoencoder_reconstruction_test"] = ae.get("figures", {}).get("reconstruction_test")
    if grid:
        if name == "CLS_COND_DDIM":
            per_class = len(px) // 10
            order = [c * per_class + k for k in range(min(10, per_class)) for c in range(10)]
            save_grid(px[order], f"docs/img/{name.lower()}_grid.png")
        else:
            save_grid(px[:100], f"docs/img/{name.lower()}_grid.png")
    fig["pipeline"] = str(model.instance.pipe.path)
    return fig


def record(name: str, fig: dict[str, Any], command: str) -> None:
    """Store ``fig`` in the pipeline's manifest under figures[<model> <scheduler> <steps>]."""
    path = Path(fig["pipeline"]) / "manifest.json"
    manifest = json.loads(path.read_text())
    key = f"{name} {fig['scheduler']} {fig['steps']}"
    entry = {k: v for k, v in fig.items() if k != "pipeline"}
    manifest.setdefault("figures", {})[key] = {**entry, "command": command}
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scheduler", default=None, help="override the default scheduler")
    parser.add_argument("--steps", type=int, default=None, help="override the default steps")
    parser.add_argument(
        "--grid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/img/<model>_grid.png (default: only at the default scheduler)",
    )
    parser.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store the figures in the pipeline's manifest.json",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    judge = load_judge()
    grid = args.grid if args.grid is not None else args.scheduler is None and args.steps is None
    results: dict[str, Any] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        fig = evaluate_model(
            name,
            args.samples,
            args.seed,
            args.batch,
            judge,
            grid,
            scheduler=args.scheduler,
            steps=args.steps,
        )
        results[name] = fig
        print(f"{name}: {json.dumps(fig)}", flush=True)
        if args.record:
            command = (
                ".venv/bin/python -m training.diffusion.evaluate "
                f"--models {name} --samples {args.samples} --seed {args.seed}"
                + (f" --scheduler {args.scheduler}" if args.scheduler else "")
                + (f" --steps {args.steps}" if args.steps else "")
            )
            record(name, fig, command)
    return results


if __name__ == "__main__":
    main()
