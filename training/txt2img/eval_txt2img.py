"""Score the text-to-image pipeline's prompt following with both judges.

    .venv/bin/python -m training.txt2img.eval_txt2img [--prompts 300] [--served] \
        [--steps 25] [--guidance 5] [--scheduler ddim|dpmsolver++] [--write-manifest]

Takes the first ``--prompts`` captions of the ``eval`` split (a seed neither the
generator nor the judges trained on), generates one picture per caption and prints,
for each judge, the per-attribute accuracy against the caption. ``--served`` generates
through the model server's own TXT2IMG model (``conf/server/diffusion/txt2img.toml``
built by ``models.registry.create_model``, one job per prompt at the catalog's
defaults, seed ``--seed + i``, the PNG it returns decoded): the server's default
settings as served. Without it the shipped pipeline is called directly
(``StableDiffusionPipeline.from_pretrained(local_files_only=True)``, its files checked
against the manifest first; pictures quantised to 8 bits as served) with ``--steps``,
``--guidance`` and ``--scheduler``.

The judges: the CNN (``judge.py``: the nearest class per attribute) and the strict one
(``strict_judge.py``: how well the named shape is drawn; its table adds the mean IoU of
the named shape's fit and why shapes failed). Rows, next to the generated one:

* the eval split's own pictures (the judges' ceiling on the training distribution),
* the autoencoder's reconstructions of them (the ceiling the latent space allows;
  their PSNR against the originals is printed too),
* pictures generated from the empty prompt (the pipeline ignoring the text),
* uniform random pictures (chance as this judge sees it), and ``1 / classes``.

``--write-manifest`` records the table under ``figures`` in
``weights/txt2img/manifest.json`` (the manifest's file table is unchanged); ``--grid``
writes the first 16 prompts' reference pictures over their generated ones as a PNG.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.data.captions import ALLOWED_PAIRS, ATTRIBUTES
from mortred_twisted.models.diffusion.manifest import (
    MANIFEST_NAME,
    pipeline_files,
    read_manifest,
    verify_files,
)
from training.txt2img import common, strict_judge
from training.txt2img.judge import AttributeJudge, load_judge

COLUMNS = (*ATTRIBUTES, "all_four")
STRICT_COLUMNS = (*COLUMNS, "shape_iou", *(f"fail: {r}" for r in strict_judge.REASONS))
SERVED_CONFIG = common.ROOT / "conf" / "server" / "diffusion" / "txt2img.toml"


def load_pipeline(directory: Path, scheduler: str) -> Any:
    """The shipped pipeline, every file checked against its manifest, on CPU float32."""
    from diffusers import DPMSolverMultistepScheduler, StableDiffusionPipeline

    verify_files(directory, read_manifest(directory), pipeline_files(directory))
    pipe = StableDiffusionPipeline.from_pretrained(directory, local_files_only=True)
    if scheduler == "dpmsolver++":
        pipe.scheduler = DPMSolverMultistepScheduler.from_config(
            pipe.scheduler.config, algorithm_type="dpmsolver++"
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def generate(
    pipe: Any, prompts: list[str], steps: int, guidance: float, seed: int, batch: int
) -> torch.Tensor:
    """One picture per prompt, in ``[-1, 1]`` after 8-bit quantisation, ``(N, 3, H, W)``."""
    out = []
    for i in range(0, len(prompts), batch):
        gen = torch.Generator().manual_seed(seed + i)
        images = pipe(
            prompts[i : i + batch],
            num_inference_steps=steps,
            guidance_scale=guidance,
            generator=gen,
            output_type="pt",
        ).images
        out.append((images * 255.0).round() / 127.5 - 1.0)
    return torch.cat(out)


@torch.no_grad()
def generate_served(
    config_path: Path, prompts: list[str], seed: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One picture per prompt from the server's own model at its catalog defaults.

    Returns the decoded PNGs in ``[-1, 1]``, ``(N, 3, H, W)``, and the settings the
    model reported (scheduler, steps) plus the configured guidance.
    """
    import base64
    import io

    import numpy as np
    from PIL import Image

    from mortred_twisted.config.server import load_server_config
    from mortred_twisted.model_api.base import InferenceRequest, RunContext
    from mortred_twisted.models.registry import create_model

    config = load_server_config(config_path, env={})
    options = dict(config.model_options)
    model = create_model(config.model_type, options, common.ROOT)
    out, settings = [], {}
    try:
        for i, prompt in enumerate(prompts):
            request = InferenceRequest(f"eval-{i}", params={"prompt": prompt, "seed": seed + i})
            data = model.run(model.validate(request), RunContext())
            png = base64.b64decode(data["images"][0]["base64"])
            rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
            out.append(torch.from_numpy(rgb.copy()).permute(2, 0, 1).float() / 127.5 - 1.0)
            settings = {"scheduler": data["scheduler"], "steps": data["steps"]}
    finally:
        model.close()
    settings["guidance"] = options.get("guidance_scale")
    return torch.stack(out), settings


def psnr(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean PSNR in dB of pictures in ``[-1, 1]`` (peak 2)."""
    mse = ((x - y) ** 2).flatten(1).mean(1).clamp_min(1e-12)
    return round(float((10 * torch.log10(4.0 / mse)).mean()), 2)


@torch.no_grad()
def reconstruct(pipe: Any, x: torch.Tensor) -> torch.Tensor:
    rec = [pipe.vae.decode(pipe.vae.encode(b).latent_dist.mean).sample for b in x.split(256)]
    return ((torch.cat(rec).clamp(-1, 1) + 1.0) * 127.5).round() / 127.5 - 1.0


def write_grid(path: Path, references: torch.Tensor, samples: torch.Tensor) -> None:
    """Two rows per 8 prompts: the eval-split pictures, then the generated ones (x2 size)."""
    from PIL import Image

    def row(t: torch.Tensor) -> torch.Tensor:
        return torch.cat(list(t), dim=2)  # (3, H, W * n)

    rows = []
    for i in range(0, len(samples), 8):
        rows += [row(references[i : i + 8]), row(samples[i : i + 8])]
    grid = ((torch.cat(rows, dim=1) + 1.0) * 127.5).round().clamp(0, 255).byte()
    image = Image.fromarray(grid.permute(1, 2, 0).numpy())
    path.parent.mkdir(parents=True, exist_ok=True)
    image.resize((image.width * 2, image.height * 2), Image.NEAREST).save(path)


def score(judge: AttributeJudge, x: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    hit = judge.predict(x) == labels
    row = {name: round(float(hit[:, i].float().mean()), 4) for i, name in enumerate(ATTRIBUTES)}
    row["all_four"] = round(float(hit.all(1).float().mean()), 4)
    return row


def chance_row() -> dict[str, float]:
    row = {name: round(1.0 / len(values), 4) for name, values in ATTRIBUTES.items()}
    combos = len(ATTRIBUTES["shape"]) * len(ATTRIBUTES["position"]) * len(ALLOWED_PAIRS)
    row["colour"] = row["background"] = round(1.0 / len(ATTRIBUTES["colour"]), 4)
    row["all_four"] = round(1.0 / combos, 5)
    return row


def strict_score(x: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    return strict_judge.judge_pictures(x.numpy(), labels.numpy())


def print_table(
    title: str, rows: dict[str, dict[str, float]], columns: tuple[str, ...] = COLUMNS
) -> None:
    width = max(len(k) for k in rows)
    print(title)
    print(f"{'':{width}}  " + "  ".join(f"{c:>10}" for c in columns))
    for name, row in rows.items():
        print(f"{name:{width}}  " + "  ".join(f"{row[c]:10.3f}" for c in columns))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--scheduler", default="ddim", choices=("ddim", "dpmsolver++"))
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pipeline", type=Path, default=common.PIPELINE_DIR)
    parser.add_argument("--judge", type=Path, default=common.JUDGE_DIR)
    parser.add_argument("--write-manifest", action="store_true")
    parser.add_argument(
        "--served", action="store_true", help="generate through the served TXT2IMG model"
    )
    parser.add_argument("--served-config", type=Path, default=SERVED_CONFIG)
    parser.add_argument(
        "--no-controls", action="store_true", help="only the generated row (a sweep)"
    )
    parser.add_argument("--grid", type=Path, default=None, help="PNG: references over samples")
    args = parser.parse_args(argv)
    common.setup(args.seed, args.threads)
    judge = load_judge(args.judge)
    x, labels, prompts = common.split_tensors("eval", args.prompts)
    pipe = (
        None if args.served and args.no_controls else load_pipeline(args.pipeline, args.scheduler)
    )
    pictures: dict[str, torch.Tensor] = {}
    extra: dict[str, Any] = {}
    if not args.no_controls:
        pictures["eval-split pictures (ceiling)"] = x
        rec = reconstruct(pipe, x)
        pictures["autoencoder reconstructions"] = rec
        extra["autoencoder_psnr_db"] = psnr(rec, x)
    start = time.monotonic()
    if args.served:
        generated, settings = generate_served(args.served_config, prompts, args.seed)
        label = (
            f"served defaults ({settings['scheduler']}, {settings['steps']} steps, "
            f"guidance {settings['guidance']:g})"
        )
    else:
        generated = generate(pipe, prompts, args.steps, args.guidance, args.seed, args.batch)
        label = f"generated ({args.scheduler}, {args.steps} steps, guidance {args.guidance:g})"
    seconds = time.monotonic() - start
    pictures[label] = generated
    if not args.no_controls:
        pictures["generated from the empty prompt"] = generate(
            pipe, [""] * len(prompts), args.steps, 1.0, args.seed, args.batch
        )
        pictures["uniform random pictures"] = (
            torch.rand(x.shape, generator=torch.Generator().manual_seed(args.seed)) * 2 - 1
        )
    rows = {name: score(judge, p, labels) for name, p in pictures.items()}
    strict_rows = {name: strict_score(p, labels) for name, p in pictures.items()}
    if not args.no_controls:
        rows["chance (1 / classes)"] = chance_row()
    print(f"{len(prompts)} prompts of the eval split; judge {args.judge}; pipeline {args.pipeline}")
    print_table("CNN judge (nearest class):", rows)
    print_table("strict judge (training/txt2img/strict_judge.py):", strict_rows, STRICT_COLUMNS)
    if "autoencoder_psnr_db" in extra:
        print(f"autoencoder reconstructions: PSNR {extra['autoencoder_psnr_db']:.2f} dB")
    per_image = seconds / len(prompts)
    print(f"generation: {seconds:.1f} s for {len(prompts)} pictures ({per_image:.3f} s each)")
    if args.grid is not None:
        write_grid(args.grid, x[:16], generated[:16])
        print(f"grid written to {args.grid}")
    if args.write_manifest:
        path = args.pipeline / MANIFEST_NAME  # read just before writing: sweeps run in parallel
        data = json.loads(path.read_text())
        data.setdefault("figures", {})[label] = {
            "command": common.command_line(),
            "prompts": len(prompts),
            "seed": args.seed,
            "threads": args.threads,
            "seconds_per_image": round(per_image, 4),
            "rows": rows,
            "strict_rows": strict_rows,
            **extra,
        }
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")


if __name__ == "__main__":
    main()
