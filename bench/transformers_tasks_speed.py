"""Speed of ``type = "transformers"`` per task on this CPU: latency of one request and
images/s one by one and batched (``predict_batch``: one forward pass per shape).

Command (about two minutes; prints a markdown table)::

    .venv/bin/python bench/transformers_tasks_speed.py [--threads 1] [--repeats 10]
        [--batch 8] [--tasks image-classification,...]

Directories: the shipped checkpoints where a task has one (the MobileNetV2 digit
classifier, RT-DETR, the SAM of SAM_AMG: real sizes, served by the new type), and
the tests' tiny random-weight public layouts for the others (CLIP, SegFormer, DPT,
and SAM at sam-vit-base's 1024-px geometry): those figures are the serving path's
cost at a small width, not a real checkpoint's. Models are called in process
through the SDK adapter (validation, decoding, encoding of result files inline), so
the figures are the model's share of a request (no HTTP). The input is a 200×150
demo scene picture.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mortred_twisted.model_api.base import InferenceRequest, RunContext  # noqa: E402
from mortred_twisted.models.registry import create_model  # noqa: E402

OPEN_AMG = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "points_per_side": 8}
# label -> (task, shipped directory or None for the tiny layout, params, options)
CASES: dict[str, tuple[str, str | None, dict[str, Any], dict[str, Any]]] = {
    "image-classification (shipped MobileNetV2)": (
        "image-classification",
        "weights/perception/mobilenetv2",
        {"top_k": 5},
        {},
    ),
    "zero-shot (tiny CLIP, 3 labels)": (
        "zero-shot-image-classification",
        None,
        {"labels": ["a cat", "a dog", "a red circle"]},
        {},
    ),
    "object-detection (shipped RT-DETR)": (
        "object-detection",
        "weights/perception/rtdetr",
        {"threshold": 0.5},
        {},
    ),
    "image-segmentation (tiny SegFormer)": ("image-segmentation", None, {}, {}),
    "depth-estimation (tiny DPT)": ("depth-estimation", None, {}, {}),
    "mask-generation (shipped SAM, 8x8 points)": (
        "mask-generation",
        "weights/perception/sam_amg",
        {},
        OPEN_AMG,
    ),
    "mask-generation (tiny sam-vit-base 1024/16, 8x8 points)": (
        "mask-generation",
        None,
        {},
        OPEN_AMG,
    ),
}


def picture() -> bytes:
    import io

    from PIL import Image

    scene = Image.open(ROOT / "demo_data" / "perception" / "scene_1.png").convert("RGB")
    buf = io.BytesIO()
    scene.resize((200, 150)).save(buf, "PNG")
    return buf.getvalue()


def bench(label: str, scratch: Path, repeats: int, batch: int) -> dict[str, float]:
    from tests.models.transformers_tasks.layouts import build

    task, shipped, params, options = CASES[label]
    directory = ROOT / shipped if shipped else build(task, scratch / task)
    model = create_model(
        "transformers", {"pretrained": str(directory), "task": task, **options}, ROOT
    )
    image = base64.b64encode(picture()).decode()

    def request(i: int) -> InferenceRequest:
        raw = InferenceRequest(req_id=f"b{i}", images=(), params={"image": image, **params})
        return model.validate(raw)

    one = request(0)
    model.run(one, RunContext())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.run(one, RunContext())
        times.append(time.perf_counter() - start)
    out = {"latency_ms": statistics.median(times) * 1000, "seq_img_s": 1 / statistics.mean(times)}
    if model.declaration.max_batch_size > 1:
        reqs = [request(i) for i in range(batch)]
        ctxs = [RunContext() for _ in reqs]
        model.run_batch(reqs, ctxs)
        rounds = max(1, repeats // 2)
        start = time.perf_counter()
        for _ in range(rounds):
            results = model.run_batch(reqs, ctxs)
        elapsed = time.perf_counter() - start
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        out["batched_img_s"] = rounds * batch / elapsed
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cases", default="", help="comma-separated labels' task names")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = {t for t in args.cases.split(",") if t}
    print(f"torch threads {args.threads}, {args.repeats} repeats, batch {args.batch}\n")
    print("| task (directory) | latency ms | img/s one by one | img/s batched |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for label, (task, *_rest) in CASES.items():
            if wanted and task not in wanted:
                continue
            r = bench(label, Path(scratch), args.repeats, args.batch)
            batched = f"{r['batched_img_s']:.1f}" if "batched_img_s" in r else "(not batched)"
            print(
                f"| {label} | {r['latency_ms']:.1f} | {r['seq_img_s']:.1f} | {batched} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
