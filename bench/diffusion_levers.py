"""The denoiser's levers on this CPU: memory format, attention kernel, bfloat16, compile.

    .venv/bin/python bench/diffusion_levers.py [--models DDIM,LDM] [--rows 1,8,16]
        [--repeats 12] [--compile] [--json out.json]

Per model (its shipped pipeline, CPU, one torch thread), the milliseconds of one
denoiser call on ``rows`` images, for each variant of the same weights, measured in
turn (every repeat runs every variant once per batch size; medians reported):

* ``default``: float32, NCHW, diffusers' default attention (``AttnProcessor2_0``:
  ``torch.nn.functional.scaled_dot_product_attention``, i.e. SDPA);
* ``channels_last``: the same in channels-last memory format (weights and inputs);
* ``no SDPA``: attention by explicit matmul + softmax (diffusers' ``AttnProcessor``);
* ``bfloat16``: weights and inputs in bfloat16 (the output's difference from float32
  is reported: max absolute and relative error of the predicted noise);
* ``compile`` (with ``--compile``): ``torch.compile(dynamic=True)``; the seconds the
  compilation and its first calls took are reported.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mortred_twisted.models.registry import create_model  # noqa: E402

CONFIGS = {
    "DDPM": "conf/model/diffusion/ddpm.toml",
    "DDIM": "conf/model/diffusion/ddim.toml",
    "CLS_COND_DDIM": "conf/model/diffusion/cls_cond_ddim.toml",
    "LDM": "conf/model/diffusion/ldm.toml",
}


def variants(net: torch.nn.Module, with_compile: bool) -> dict[str, Any]:
    """name -> (module, input dtype, channels_last)."""
    from diffusers.models.attention_processor import Attention, AttnProcessor

    out: dict[str, Any] = {"default": (net, torch.float32, False)}
    out["channels_last"] = (
        copy.deepcopy(net).to(memory_format=torch.channels_last), torch.float32, True,
    )  # fmt: skip
    classic = copy.deepcopy(net)
    for module in classic.modules():
        if isinstance(module, Attention):
            module.set_processor(AttnProcessor())
    out["no SDPA"] = (classic, torch.float32, False)
    out["bfloat16"] = (copy.deepcopy(net).to(torch.bfloat16), torch.bfloat16, False)
    if with_compile:
        out["compile"] = (torch.compile(copy.deepcopy(net), dynamic=True), torch.float32, False)
    return out


def call(net: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, y: Any) -> torch.Tensor:
    if y is None:
        return net(x, t).sample
    return net(x, t, class_labels=y).sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="DDIM,LDM")
    parser.add_argument("--rows", default="1,8,16")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(r) for r in args.rows.split(",")]
    rows_out: list[dict[str, Any]] = []
    print("| model | variant | " + " | ".join(f"{n} rows ms" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for name in args.models.split(","):
        options = tomllib.loads((ROOT / CONFIGS[name]).read_text())
        options.update(device="cpu", channels_last=False, max_running_jobs=1)
        model = create_model(name, options, ROOT).instance  # the family's DiffusionModel
        net, shape = model.pipe.denoiser, model.pipe.latent_shape
        conditional = model.pipe.num_classes > 0
        nets = variants(net, args.compile)
        notes: dict[str, str] = {}
        times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in sizes} for k in nets}
        with torch.inference_mode():
            if args.compile:
                started = time.perf_counter()
                for n in sizes:
                    x = torch.randn(n, *shape)
                    y = torch.zeros(n, dtype=torch.long) if conditional else None
                    call(nets["compile"][0], x, torch.full((n,), 500.0), y)
                notes["compile"] = f"compile + first calls {time.perf_counter() - started:.0f} s"
            for _ in range(args.repeats):
                for n in sizes:
                    x = torch.randn(n, *shape)
                    t = torch.full((n,), 500.0)
                    y = (
                        torch.randint(0, max(1, model.pipe.num_classes), (n,))
                        if conditional
                        else None
                    )
                    for key, (module, dtype, nhwc) in nets.items():
                        xx = x.to(dtype)
                        if nhwc:
                            xx = xx.contiguous(memory_format=torch.channels_last)
                        call(module, xx, t, y)
                        started = time.perf_counter()
                        for _ in range(3):
                            call(module, xx, t, y)
                        times[key][n].append((time.perf_counter() - started) / 3 * 1000)
            x = torch.randn(8, *shape)
            t = torch.full((8,), 500.0)
            y = torch.zeros(8, dtype=torch.long) if conditional else None
            ref = call(net, x, t, y).float()
            low = call(nets["bfloat16"][0], x.to(torch.bfloat16), t, y).float()
            err = (ref - low).abs().max().item()
            rel = ((ref - low).norm() / ref.norm()).item()
            notes["bfloat16"] = (
                f"noise prediction vs float32: max abs {err:.3f}, relative {rel:.4f}"
            )
        for key, per_size in times.items():
            medians = {n: round(statistics.median(v), 2) for n, v in per_size.items()}
            rows_out.append({"model": name, "variant": key, "ms": medians, "note": notes.get(key)})
            cells = " | ".join(str(medians[n]) for n in sizes)
            note = f" ({notes[key]})" if key in notes else ""
            print(f"| {name} | {key}{note} | {cells} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=2))


if __name__ == "__main__":
    main()
