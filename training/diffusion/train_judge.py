"""Train the judge digit classifier (one command, seeded).

    .venv/bin/python -m training.diffusion.train_judge [--epochs 40] [--threads 1]

Writes ``weights/diffusion/judge.pt`` and its manifest entry; prints the loss curve and
the held-out (test split) accuracy, the figure the quality evaluations rely on.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from mortred_twisted.models.diffusion.judge import JUDGE_ARCH, DigitJudge
from training.diffusion import common


def shift(x: torch.Tensor, gen: torch.Generator, max_shift: int = 1) -> torch.Tensor:
    """Random integer translation by up to ``max_shift`` pixels (background -1)."""
    pad = F.pad(x, (max_shift,) * 4, value=-1.0)
    out = torch.empty_like(x)
    size = x.shape[-1]
    offs = torch.randint(0, 2 * max_shift + 1, (x.shape[0], 2), generator=gen)
    for i, (dy, dx) in enumerate(offs.tolist()):
        out[i] = pad[i, :, dy : dy + size, dx : dx + size]
    return out


@torch.no_grad()
def accuracy(net: DigitJudge, x: torch.Tensor, y: torch.Tensor) -> float:
    net.eval()
    return float((net(x).argmax(1) == y).float().mean())


def main() -> None:
    parser = common.base_parser(__doc__ or "")
    parser.add_argument("--epochs", type=int, default=40)
    parser.set_defaults(lr=2e-3, batch=64)
    args = parser.parse_args()
    out = args.out or common.WEIGHTS_DIR / "judge.pt"
    device = common.setup(args)
    x_train, y_train = common.digits_tensor("train")
    x_test, y_test = common.digits_tensor("test")
    gen = torch.Generator().manual_seed(args.seed)
    net = DigitJudge(**JUDGE_ARCH).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.epochs * (len(x_train) // args.batch + 1)
    )
    curve = []
    for epoch in range(args.epochs):
        net.train()
        perm = torch.randperm(len(x_train), generator=gen)
        total = 0.0
        for start in range(0, len(x_train), args.batch):
            idx = perm[start : start + args.batch]
            xb = shift(x_train[idx], gen).to(device)
            loss = F.cross_entropy(net(xb), y_train[idx].to(device), label_smoothing=0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        acc = accuracy(net, x_test.to(device), y_test.to(device))
        curve.append((epoch + 1, total / len(x_train), acc))
        print(
            f"epoch {epoch + 1:3d}  loss {total / len(x_train):.4f}  test acc {acc:.4f}", flush=True
        )
    acc = accuracy(net, x_test.to(device), y_test.to(device))
    print(f"held-out accuracy: {acc:.4f} on {len(x_test)} test images")
    common.save_weights(
        net.state_dict(),
        out,
        {
            "kind": "judge",
            "arch": JUDGE_ARCH,
            "figures": {"test_accuracy": round(acc, 4), "test_images": len(x_test)},
            "training": {
                "command": common.command_line(),
                "data": common.DATA_DESCRIPTION + "; random 1-pixel shifts",
                "seed": args.seed,
                "epochs": args.epochs,
                "batch": args.batch,
                "lr": args.lr,
                "loss_curve": [[e, round(v, 4), round(a, 4)] for e, v, a in curve],
            },
        },
    )


if __name__ == "__main__":
    main()
