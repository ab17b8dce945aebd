"""Speed of the perception models on this CPU: latency per image, throughput with and
without dynamic batching (``run_batch``: many requests, one forward pass).

Command (a few minutes; prints a markdown table)::

    .venv/bin/python bench/perception_speed.py [--threads 1] [--repeats 30] [--batch 8]
        [--runs 3] [--models MOBILENETV2,YOLOV8,RTDETR,SAM_AMG]
        [--sammodel weights/perception/sam_amg]

Each figure is the median of ``--runs`` runs (the models alternate within a run, so a
burst of load on a shared machine lands on all of them), with the runs' range.

Models are built from the shipped configs (verified weights) and called in-process,
so the figures are the model's share of a request (no HTTP). Inputs are the demo
pictures under ``demo_data/perception/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mortred_twisted.model_api.base import InferenceRequest, RunContext  # noqa: E402
from mortred_twisted.models.registry import create_model  # noqa: E402

SAM_CONFIG = "conf/model/segment_anything/sam_amg.toml"
# name -> (model type, model config, demo picture, option overrides)
MODELS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "MOBILENETV2": (
        "MOBILENETV2",
        "conf/model/classification/mobilenetv2.toml",
        "digit_canvas_3.png",
        {},
    ),
    "YOLOV8": ("YOLOV8", "conf/model/object_detection/yolov8.toml", "scene_1.png", {}),
    "RTDETR": (
        "OBJECT_DETECTION",
        "conf/model/object_detection/rtdetr.toml",
        "scene_1.png",
        {},
    ),
    "SAM_AMG": ("SAM_AMG", SAM_CONFIG, "scene_1.png", {}),
}


def _request(image: bytes, i: int) -> InferenceRequest:
    return InferenceRequest(req_id=f"bench-{i}", images=(image,))


def bench(name: str, repeats: int, batch: int) -> dict[str, float]:
    """Median latency (ms) of one request, and images/s one by one and batched."""
    model_type, config, picture, overrides = MODELS[name]
    options = tomllib.loads((ROOT / config).read_text("utf-8"))
    options.update(overrides)
    model = create_model(model_type, options, ROOT)
    image = (ROOT / "demo_data" / "perception" / picture).read_bytes()
    request = model.validate(_request(image, 0))
    model.run(request, RunContext())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.run(request, RunContext())
        times.append(time.perf_counter() - start)
    out = {
        "latency_ms": statistics.median(times) * 1000,
        "seq_img_s": 1.0 / statistics.mean(times),
    }
    if model_type != "SAM_AMG":
        reqs = [model.validate(_request(image, i)) for i in range(batch)]
        ctxs = [RunContext() for _ in reqs]
        model.run_batch(reqs, ctxs)
        rounds = max(1, repeats // 2)
        start = time.perf_counter()
        for _ in range(rounds):
            model.run_batch(reqs, ctxs)
        out["batched_img_s"] = rounds * batch / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=3, help="runs; figures are their median")
    parser.add_argument(
        "--sammodel",
        default="weights/perception/sam_amg",
        help="SamModel directory of SAM_AMG",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    MODELS["SAM_AMG"][3]["pretrained"] = args.sammodel
    names = args.models.split(",")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(args.runs):
        for name in names:
            is_sam = MODELS[name][0] == "SAM_AMG"
            repeats = max(3, args.repeats // 10) if is_sam else args.repeats
            runs[name].append(bench(name, repeats, args.batch))
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
        f"median of {args.runs} run(s) (range)\n"
    )
    print(
        "| model | latency / image (median ms) | throughput, one by one (img/s) "
        f"| throughput, batched x{args.batch} (img/s) |"
    )
    print("|---|---|---|---|")

    def cell(name: str, key: str, digits: int) -> str:
        values = [r[key] for r in runs[name] if key in r]
        if not values:
            return "n/a (async job)"
        med = statistics.median(values)
        return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    for name in names:
        print(
            f"| {name} | {cell(name, 'latency_ms', 1)} | {cell(name, 'seq_img_s', 1)} "
            f"| {cell(name, 'batched_img_s', 0)} |"
        )


if __name__ == "__main__":
    main()
