"""Speed of the diffusion models per scheduler, and diffusers' import/load time.

    .venv/bin/python bench/diffusion_speed.py [--models DDPM,DDIM,CLS_COND_DDIM,LDM]
        [--runs default,dpmsolver++:20] [--threads 1] [--batch 8] [--json out.json]

First, in this fresh process: the seconds ``import diffusers`` takes and, per model,
the seconds ``create_model`` takes (reading and verifying the pipeline directory,
loading its components; the first model pays for importing the diffusers model
classes). Then for each ``torch.set_num_threads`` value, model and run
(``default`` = the model's configured scheduler and steps, ``NAME:STEPS`` = that
scheduler at that many steps) it measures, through :meth:`Model.run` exactly as the
server calls it (PNG encoding included), after one short warm-up run:

* ``single``: one image -> seconds per image and steps/s;
* ``batched``: one run with ``num_images = --batch`` -> seconds per image.

Models are built from ``conf/model/diffusion/<name>.toml`` on the CPU.
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

from mortred_twisted.model_api.base import InferenceRequest, RunContext  # noqa: E402
from mortred_twisted.models.registry import create_model  # noqa: E402

CONFIGS = {
    "DDPM": "conf/model/diffusion/ddpm.toml",
    "DDIM": "conf/model/diffusion/ddim.toml",
    "CLS_COND_DDIM": "conf/model/diffusion/cls_cond_ddim.toml",
    "LDM": "conf/model/diffusion/ldm.toml",
}


def timed_run(model: Any, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    request = model.validate(InferenceRequest(req_id="bench", params=params))
    start = time.perf_counter()
    data = model.run(request, RunContext())
    return time.perf_counter() - start, data


def load_models(names: list[str]) -> tuple[dict[str, Any], dict[str, float]]:
    """Build each model (timed); the first timing includes ``import diffusers``."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    import diffusers  # noqa: F401

    seconds["import diffusers"] = round(time.perf_counter() - start, 2)
    models = {}
    for name in names:
        options = {**tomllib.loads((ROOT / CONFIGS[name]).read_text()), "device": "cpu"}
        start = time.perf_counter()
        models[name] = create_model(name, options, ROOT)
        seconds[f"load {name}"] = round(time.perf_counter() - start, 2)
    return models, seconds


def bench_run(model: Any, run: str, batch: int) -> dict[str, Any]:
    base: dict[str, Any] = {"seed": 0}
    if run != "default":
        scheduler, steps = run.split(":")
        base.update(scheduler=scheduler, sample_steps=int(steps))
    timed_run(model, {**base, "sample_steps": 2})  # warm-up (allocator, kernels)
    single, data = timed_run(model, base)
    batched, _ = timed_run(model, {**base, "num_images": batch})
    return {
        "scheduler": data["scheduler"],
        "steps": data["steps"],
        "s_per_image": round(single, 3),
        "steps_per_s": round(data["steps"] / single, 1),
        "batched_s_per_image": round(batched / batch, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--runs", default="default,dpmsolver++:20")
    parser.add_argument("--threads", default="1", help="comma list of set_num_threads")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    models, load_seconds = load_models(names)
    print("load times (s):", json.dumps(load_seconds), flush=True)
    rows: list[dict[str, Any]] = []
    print(
        "| model | threads | scheduler | steps | s/image | steps/s | "
        f"batched ({args.batch}) s/image |"
    )
    print("|---|---|---|---|---|---|---|")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name in names:
            for run in args.runs.split(","):
                row = {
                    "model": name,
                    "threads": threads,
                    **bench_run(models[name], run, args.batch),
                }
                rows.append(row)
                print(
                    f"| {name} | {threads} | {row['scheduler']} | {row['steps']} | "
                    f"{row['s_per_image']} | {row['steps_per_s']} | "
                    f"{row['batched_s_per_image']} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps({"load_seconds": load_seconds, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
