"""The autoencoder alone: what shape survives an encode/decode, per shape (issue 39, item 2).

    .venv/bin/python -m training.txt2img.autoencoder_ceiling [--prompts 300] [--threads 1]

Encodes the first ``--prompts`` pictures of the ``eval`` split with the shipped
pipeline's ``AutoencoderKL`` (the latent mean, as ``eval_txt2img`` does), decodes them,
quantises to 8 bits as served, and prints per shape: the strict judge's shape pass
rate, the mean IoU of the named shape's fit, why shapes failed, and the PSNR against
the originals. No UNet is involved: this is the best any denoiser can reach in this
latent space.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mortred_twisted.data.captions import SHAPES
from training.txt2img import common, strict_judge
from training.txt2img.eval_txt2img import load_pipeline, psnr, reconstruct


def per_shape(x: torch.Tensor, rec: torch.Tensor, labels: torch.Tensor) -> dict[str, dict]:
    """One row per shape (and ``all``): strict-judge figures of ``rec`` and its PSNR."""
    rows = {}
    groups = {name: labels[:, 0] == k for k, name in enumerate(SHAPES)}
    groups["all"] = torch.ones(len(labels), dtype=torch.bool)
    for name, sel in groups.items():
        row = strict_judge.judge_pictures(rec[sel].numpy(), labels[sel].numpy())
        row["psnr_db"] = psnr(rec[sel], x[sel])
        row["pictures"] = int(sel.sum())
        rows[name] = row
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pipeline", type=Path, default=common.PIPELINE_DIR)
    args = parser.parse_args(argv)
    common.setup(0, args.threads)
    pipe = load_pipeline(args.pipeline, "ddim")
    x, labels, _ = common.split_tensors("eval", args.prompts)
    rows = per_shape(x, reconstruct(pipe, x), labels)
    reasons = tuple(f"fail: {r}" for r in strict_judge.REASONS)
    columns = ("pictures", "shape", "shape_iou", "psnr_db", *reasons)
    print(f"autoencoder round trip of {len(x)} eval-split pictures ({args.pipeline / 'vae'})")
    print(f"{'':9}" + "".join(f"{c:>18}" for c in columns))
    for name, row in rows.items():
        print(f"{name:9}" + "".join(f"{row[c]:18.3f}" for c in columns))


if __name__ == "__main__":
    main()
