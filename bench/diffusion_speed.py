"""Speed of the diffusion models at their default schedules (one command).

    .venv/bin/python bench/diffusion_speed.py [--models DDPM,DDIM,CLS_COND_DDIM,LDM]
        [--threads 1,2] [--batch 8] [--steps N] [--json out.json]

For each model and ``torch.set_num_threads`` value it measures, through
:meth:`Model.run` exactly as the server calls it (PNG encoding included):

* ``single``: one image at the default schedule -> seconds per sample and steps/s;
* ``loop``: ``--batch`` such runs one after the other -> seconds per image;
* ``batched``: one run with ``num_images = --batch`` -> seconds per image.

``--steps`` overrides the step count (for a quick look); the published table uses the
defaults. Models are built from ``conf/model/diffusion/<name>.toml`` on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mortred_twisted.models.base import InferenceRequest, RunContext  # noqa: E402
from mortred_twisted.models.registry import create_model  # noqa: E402

CONFIGS = {
    "DDPM": ("conf/model/diffusion/ddpm.toml", "timesteps"),
    "DDIM": ("conf/model/diffusion/ddim.toml", "sample_steps"),
    "CLS_COND_DDIM": ("conf/model/diffusion/cls_cond_ddim.toml", "sample_steps"),
    "LDM": ("conf/model/diffusion/ldm.toml", "sample_steps"),
}


def timed_run(model: Any, params: dict[str, Any]) -> tuple[float, int]:
    request = model.validate(InferenceRequest(req_id="bench", params=params))
    start = time.perf_counter()
    data = model.run(request, RunContext())
    return time.perf_counter() - start, int(data["steps"])


def bench_model(name: str, batch: int, steps: int | None) -> dict[str, Any]:
    path, step_key = CONFIGS[name]
    options = {**tomllib.loads((ROOT / path).read_text()), "device": "cpu"}
    model = create_model(name, options, ROOT)
    base: dict[str, Any] = {"seed": 0}
    if steps is not None:
        base[step_key] = steps
    timed_run(model, {**base, step_key: 2})  # warm-up (allocator, kernels)
    single, n_steps = timed_run(model, base)
    loop = sum(timed_run(model, {**base, "seed": i})[0] for i in range(batch))
    batched, _ = timed_run(model, {**base, "num_images": batch})
    return {
        "steps": n_steps,
        "s_per_sample": round(single, 3),
        "steps_per_s": round(n_steps / single, 1),
        "loop_s_per_image": round(loop / batch, 3),
        "batched_s_per_image": round(batched / batch, 3),
        "batched_speedup": round(loop / batched, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--threads", default="1,2", help="comma list of set_num_threads")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print(
        "| model | threads | steps | s/sample | steps/s | loop s/image | "
        f"batched ({args.batch}) s/image | batch speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in args.models.split(","):
            row = {"model": name, "threads": threads, **bench_model(name, args.batch, args.steps)}
            rows.append(row)
            print(
                f"| {name} | {threads} | {row['steps']} | {row['s_per_sample']} | "
                f"{row['steps_per_s']} | {row['loop_s_per_image']} | "
                f"{row['batched_s_per_image']} | {row['batched_speedup']}x |",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
