"""Shared plumbing of the perception training scripts: flags, seeding, timing.

Every script is one command (``.venv/bin/python -m training.perception.<name>``),
seeded (python, numpy and torch from ``--seed``), prints its figures
and writes weights plus a manifest entry under ``weights/perception/``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
WEIGHTS_DIR = ROOT / "weights" / "perception"


def base_parser(description: str) -> argparse.ArgumentParser:
    """Flags common to every script: ``--seed``, ``--threads``, ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=0, help="global seed")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=None, help="weights file to write")
    return parser


def setup(seed: int, threads: int) -> torch.Generator:
    """Seed python, numpy and torch; pin the thread count; return a torch generator."""
    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def command_line() -> str:
    """The command that ran this script, as recorded in the manifest."""
    module = sys.modules["__main__"].__spec__
    name = module.name if module is not None else sys.argv[0]
    return " ".join([".venv/bin/python -m", name, *sys.argv[1:]])


class Timer:
    """Wall-clock seconds since construction."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def log(msg: str) -> None:
    print(msg, flush=True)
