"""Shared pieces of the diffusion training scripts (seeding, data, the judge's manifest).

Every script is one command, seeded, single-process; ``--threads`` sets
``torch.set_num_threads`` (default 1: the development machine has 2 shared cores).
A CUDA device is used when ``--device cuda`` (or ``auto`` and one is present).
The generators (``train_pipeline``) write diffusers pipeline directories with their
own manifest; the judge (``train_judge``) is a plain state dict listed in
``weights/diffusion/manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mortred_twisted.data.digits import SPLIT_SEED, TEST_FRACTION, load_digit_split
from mortred_twisted.models.diffusion.manifest import sha256_file

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS_DIR = ROOT / "weights" / "diffusion"
MANIFEST = WEIGHTS_DIR / "manifest.json"
IMAGE_SIZE = 16
DATA_DESCRIPTION = (
    f"sklearn.datasets.load_digits resized bilinearly to {IMAGE_SIZE}x{IMAGE_SIZE}, "
    f"train split of mortred_twisted.data.digits (seed {SPLIT_SEED}, "
    f"test fraction {TEST_FRACTION}), pixels scaled to [-1, 1]"
)


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out", type=Path, default=None, help="weights file to write")
    return parser


def setup(args: argparse.Namespace) -> torch.device:
    """Seed every generator, set the thread count, pick the device."""
    torch.set_num_threads(max(1, args.threads))
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def command_line() -> str:
    module = Path(sys.argv[0]).resolve().relative_to(ROOT).with_suffix("")
    return " ".join([".venv/bin/python -m " + ".".join(module.parts), *sys.argv[1:]])


def digits_tensor(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images in [-1, 1] of shape (N, 1, 16, 16), labels (N,))``."""
    images, labels = load_digit_split(IMAGE_SIZE, split)
    x = torch.from_numpy(images).unsqueeze(1) * 2.0 - 1.0
    return x, torch.from_numpy(labels)


def save_weights(state: dict[str, torch.Tensor], path: Path, entry: dict[str, Any]) -> str:
    """Write ``state`` to ``path`` and record it (sha256 + ``entry``) in the manifest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu().contiguous() for k, v in state.items()}, path)
    digest = sha256_file(path)
    if path.resolve().parent == WEIGHTS_DIR:
        manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
        entry = {**entry, "sha256": digest, "bytes": path.stat().st_size}
        manifest.setdefault("files", {})[path.name] = entry
        manifest["format"] = 1
        MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"saved {path} sha256={digest}")
    return digest
