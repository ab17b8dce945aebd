"""Shared pieces of the diffusion training scripts (seeding, data, the eps-loss loop,
EMA, the weights manifest).

Every script is one command, seeded, single-process; ``--threads`` sets
``torch.set_num_threads`` (default 1: the development machine has 2 shared cores).
A CUDA device is used when ``--device cuda`` (or ``auto`` and one is present).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mortred_twisted.data.digits import SPLIT_SEED, TEST_FRACTION, load_digit_split
from mortred_twisted.models.diffusion.schedule import NoiseSchedule

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
    parser.add_argument("--steps", type=int, default=3000, help="optimiser steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument(
        "--max-minutes", type=float, default=20.0, help="stop early (and save); 0 = no limit"
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop after this many steps, keeping the learning-rate schedule of --steps "
        "(replays a run that --max-minutes cut short)",
    )
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="weights file to write")
    parser.add_argument(
        "--resume", type=Path, default=None, help="start from these weights (fine-tuning)"
    )
    return parser


def maybe_resume(net: nn.Module, args: argparse.Namespace) -> None:
    """Load ``--resume`` weights into ``net`` (strict) when given."""
    if args.resume is not None:
        net.load_state_dict(torch.load(args.resume, map_location="cpu", weights_only=True))
        print(f"resumed from {args.resume}")


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


def replay_command(args: argparse.Namespace, steps_done: int, base: str | None = None) -> str:
    """A command that replays this run step for step, whatever the machine's speed.

    Runs cut short by ``--max-minutes`` depend on wall-clock time; the replay pins the
    step count with ``--stop-after`` and lifts the time limit.
    """
    cmd = base or command_line()
    if steps_done < args.steps:
        cmd += f" --stop-after {steps_done} --max-minutes 0"
    return cmd


def digits_tensor(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images in [-1, 1] of shape (N, 1, 16, 16), labels (N,))``."""
    images, labels = load_digit_split(IMAGE_SIZE, split)
    x = torch.from_numpy(images).unsqueeze(1) * 2.0 - 1.0
    return x, torch.from_numpy(labels)


class Ema:
    """Exponential moving average of a module's parameters (with warm-up)."""

    def __init__(self, net: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = copy.deepcopy(net).eval()
        for p in self.shadow.parameters():
            p.requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, net: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        for s, p in zip(self.shadow.parameters(), net.parameters(), strict=True):
            s.mul_(d).add_(p.detach(), alpha=1.0 - d)
        for s, b in zip(self.shadow.buffers(), net.buffers(), strict=True):
            s.copy_(b)


def lr_at(step: int, total: int, base: float, warmup: int = 100) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_eps(
    net: nn.Module,
    data: torch.Tensor,
    labels: torch.Tensor | None,
    schedule: NoiseSchedule,
    args: argparse.Namespace,
    device: torch.device,
    *,
    num_classes: int = 0,
    label_drop: float = 0.0,
    ema_decay: float = 0.999,
) -> tuple[nn.Module, list[tuple[int, float]]]:
    """Train ``net`` on the eps-prediction loss; return ``(ema_net, loss_curve)``.

    ``labels`` (with ``num_classes``) trains a conditional net; each label is replaced
    by the "no label" token ``num_classes`` with probability ``label_drop`` so that
    classifier-free guidance can be used at sampling time.
    """
    gen = torch.Generator().manual_seed(args.seed)
    net.to(device).train()
    data = data.to(device)
    ema = Ema(net, ema_decay)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
    sqrt_ab = torch.tensor(np.sqrt(schedule.alphas_cumprod), dtype=torch.float32)
    sqrt_1mab = torch.tensor(np.sqrt(1.0 - schedule.alphas_cumprod), dtype=torch.float32)
    sqrt_ab, sqrt_1mab = sqrt_ab.to(device), sqrt_1mab.to(device)
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    start = time.monotonic()
    n = data.shape[0]
    for step in range(args.steps):
        idx = torch.randint(0, n, (args.batch,), generator=gen).to(device)
        x0 = data[idx]
        t = torch.randint(0, schedule.timesteps, (args.batch,), generator=gen).to(device)
        eps = torch.randn(x0.shape, generator=gen).to(device)
        shape = (-1,) + (1,) * (x0.dim() - 1)
        xt = sqrt_ab[t].view(shape) * x0 + sqrt_1mab[t].view(shape) * eps
        y = None
        if labels is not None:
            y = labels.to(device)[idx].clone()
            drop = torch.rand(args.batch, generator=gen).to(device) < label_drop
            y[drop] = num_classes
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        pred = net(xt, t, y) if labels is not None else net(xt, t)
        loss = torch.mean((pred - eps) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        ema.update(net)
        window.append(float(loss.detach()))
        stop = args.stop_after is not None and step + 1 >= args.stop_after
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps or stop:
            mean = sum(window) / len(window)
            curve.append((step + 1, mean))
            window.clear()
            elapsed = time.monotonic() - start
            print(f"step {step + 1:6d}  loss {mean:.5f}  {elapsed:7.1f}s", flush=True)
            if stop:
                break
            if args.max_minutes > 0 and elapsed > args.max_minutes * 60.0:
                print(f"stopping early: --max-minutes {args.max_minutes} reached")
                break
    return ema.shadow, curve


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_weights(state: dict[str, torch.Tensor], path: Path, entry: dict[str, Any]) -> str:
    """Write ``state`` to ``path`` and record it (sha256 + ``entry``) in the manifest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu().contiguous() for k, v in state.items()}, path)
    digest = sha256_file(path)
    if path.resolve().parent == WEIGHTS_DIR:
        update_manifest(path.name, {**entry, "sha256": digest, "bytes": path.stat().st_size})
    print(f"saved {path} sha256={digest}")
    return digest


def update_manifest(name: str, entry: dict[str, Any], *, merge: bool = False) -> None:
    """Set (or with ``merge``, update) the manifest entry of weights file ``name``."""
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    files = manifest.setdefault("files", {})
    if merge and name in files:
        files[name].update(entry)
    else:
        files[name] = entry
    manifest["format"] = 1
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def format_curve(curve: list[tuple[int, float]], every: int = 5) -> str:
    picked = curve[::every] + ([curve[-1]] if curve and (len(curve) - 1) % every else [])
    return ", ".join(f"{s}:{v:.4f}" for s, v in picked)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.monotonic()
    out = fn()
    return out, time.monotonic() - start
