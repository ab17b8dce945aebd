"""Train the text-to-image judge (one command, seeded), apart from the generator.

    .venv/bin/python -m training.txt2img.train_judge [--epochs 5] [--max-minutes 15]

Trains :class:`training.txt2img.judge.AttributeJudge` on freshly generated pictures of
the ``judge`` split (its own seed: none is a generator training picture), with light
augmentation (a random amount of 3x3 blur, Gaussian pixel noise, a per-picture
brightness shift) so that it reads
the attributes of pictures that are not pixel-perfect, and measures it on the ``eval``
split. Writes ``weights/txt2img_judge/`` (``config.json``, ``judge.safetensors``,
``manifest.json`` with sha256, the command, the loss curve and the held-out accuracy
per attribute).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from mortred_twisted.data.captions import ATTRIBUTES
from mortred_twisted.models.diffusion.manifest import write_manifest
from training.txt2img import common
from training.txt2img.judge import CONFIG_NAME, JUDGE_ARCH, WEIGHTS_NAME, AttributeJudge


def accuracy(net: AttributeJudge, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    hit = net.predict(x) == y
    out = {name: round(float(hit[:, i].float().mean()), 4) for i, name in enumerate(ATTRIBUTES)}
    out["all_four"] = round(float(hit.all(1).float().mean()), 4)
    return out


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Blur by a random amount (a 3x3 box blur mixed in), add noise, shift brightness."""
    blurred = F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
    mix = torch.rand(len(x), 1, 1, 1, generator=gen)
    x = mix * blurred + (1.0 - mix) * x
    noise = torch.randn(x.shape, generator=gen) * torch.rand(len(x), 1, 1, 1, generator=gen) * 0.1
    shift = (torch.rand(len(x), 1, 1, 1, generator=gen) - 0.5) * 0.1
    return (x + noise + shift).clamp(-1.0, 1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-images", type=int, default=12000)
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--max-minutes", type=float, default=15.0, help="0 = no limit")
    parser.add_argument("--out", type=Path, default=common.JUDGE_DIR)
    args = parser.parse_args(argv)
    common.setup(args.seed, args.threads)
    from safetensors.torch import save_file

    x, y, _ = common.split_tensors("judge", args.train_images)
    x_test, y_test, _ = common.split_tensors("eval", args.test_images)
    gen = torch.Generator().manual_seed(args.seed)
    net = AttributeJudge(**JUDGE_ARCH)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    per_epoch = (len(x) + args.batch - 1) // args.batch
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.epochs * per_epoch
    )
    start = time.monotonic()
    curve = []
    for epoch in range(args.epochs):
        net.train()
        perm = torch.randperm(len(x), generator=gen)
        total = 0.0
        for first in range(0, len(x), args.batch):
            idx = perm[first : first + args.batch]
            logits = net(augment(x[idx], gen))
            loss = sum(F.cross_entropy(logits[n], y[idx, i]) for i, n in enumerate(ATTRIBUTES))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        acc = accuracy(net, x_test, y_test)
        curve.append([epoch + 1, round(total / len(x), 4), acc["all_four"]])
        print(f"epoch {epoch + 1}  loss {total / len(x):.4f}  held-out {acc}", flush=True)
        if args.max_minutes and time.monotonic() - start > args.max_minutes * 60.0:
            print(f"stopping: {args.max_minutes} minutes reached after epoch {epoch + 1}")
            break
    acc = accuracy(net, x_test, y_test)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / CONFIG_NAME).write_text(json.dumps(JUDGE_ARCH, indent=2) + "\n")
    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    save_file(state, args.out / WEIGHTS_NAME)
    write_manifest(
        args.out,
        {
            "kind": "txt2img_judge",
            "attributes": {name: list(values) for name, values in ATTRIBUTES.items()},
            "figures": {"held_out_accuracy": acc, "held_out_images": len(x_test)},
            "training": {
                "command": common.command_line(),
                "data": common.data_description("judge", args.train_images)
                + "; random 3x3 box blur mix, Gaussian noise (std up to 0.1),"
                " brightness shifts (up to 0.05)",
                "held_out": common.data_description("eval", args.test_images),
                "seed": args.seed,
                "epochs": len(curve),
                "batch": args.batch,
                "lr": args.lr,
                "threads": args.threads,
                "seconds": round(time.monotonic() - start, 1),
                "loss_curve": curve,
            },
        },
    )
    print(f"held-out accuracy: {acc} on {len(x_test)} eval-split pictures; saved {args.out}")


if __name__ == "__main__":
    main()
