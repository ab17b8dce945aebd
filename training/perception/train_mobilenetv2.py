"""Train MOBILENETV2 on scikit-learn digits with shift/scale/rotation/noise augmentation.

Command (10-35 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_mobilenetv2

Writes ``weights/perception/mobilenetv2_digits.pt`` and its manifest entry, and prints
held-out accuracy (plain, 32 px) and robust accuracy (held-out digits scaled 0.8-1.2x,
shifted on a 48 px canvas with noise sigma 0.1, resized to 32 px).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mortred_twisted.data.digits import load_digit_split
from mortred_twisted.models.classification.mobilenetv2 import MODEL_TYPE, build_network
from mortred_twisted.models.classification.weights import write_manifest_entry
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup
from training.perception.eval_mobilenetv2 import evaluate

ARCH = {
    "num_classes": 10,
    "in_channels": 1,
    "width_mult": 0.5,
    "input_size": 32,
    "stem_stride": 1,
    "strides": [1, 2, 2, 2, 1, 1, 1],
    "repeats_scale": 1.0,
    "last_channel": 640,
    "dropout": 0.2,
}


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random scale (0.45-1.1), rotation (+-12 deg), shift (digit stays mostly inside),
    contrast, Gaussian noise (sigma 0-0.2); then per-picture standardisation."""
    n = x.shape[0]
    scale = torch.empty(n).uniform_(0.45, 1.1, generator=gen)
    angle = torch.empty(n).uniform_(-12, 12, generator=gen) * math.pi / 180
    room = (1.0 - scale).clamp(min=0.0) + 0.05
    cx = (torch.rand(n, generator=gen) * 2 - 1) * room
    cy = (torch.rand(n, generator=gen) * 2 - 1) * room
    cos, sin = torch.cos(angle), torch.sin(angle)
    # input = R (out - c) / s
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1] = cos / scale, -sin / scale
    theta[:, 1, 0], theta[:, 1, 1] = sin / scale, cos / scale
    theta[:, 0, 2] = -(cos * cx - sin * cy) / scale
    theta[:, 1, 2] = -(sin * cx + cos * cy) / scale
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    contrast = torch.empty(n, 1, 1, 1).uniform_(0.5, 1.0, generator=gen)
    offset = torch.empty(n, 1, 1, 1).uniform_(0.0, 0.2, generator=gen)
    sigma = torch.empty(n, 1, 1, 1).uniform_(0.0, 0.2, generator=gen)
    out = out * contrast + offset + torch.randn(out.shape, generator=gen) * sigma
    out = out.clamp(0.0, 1.0)
    mean = out.mean(dim=(2, 3), keepdim=True)
    std = out.std(dim=(2, 3), keepdim=True, unbiased=False)
    return (out - mean) / (std + 1e-3)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    gen = setup(args.seed, args.threads)
    out_path = args.out or WEIGHTS_DIR / "mobilenetv2_digits.pt"
    size = ARCH["input_size"]
    images, labels = load_digit_split(size, "train")
    x_all = torch.from_numpy(images).unsqueeze(1)
    y_all = torch.from_numpy(labels)
    net = build_network(ARCH)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps)
    timer = Timer()
    net.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x_all.shape[0], (args.batch,), generator=gen)
        logits = net(augment(x_all[idx], gen))
        loss = F.cross_entropy(logits, y_all[idx], label_smoothing=0.05)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 200 == 0 or step == args.steps:
            log(f"step {step}/{args.steps} loss {loss.item():.4f} t={timer():.0f}s")
    net.eval()
    checkpoint = {
        "arch": ARCH,
        "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()},
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out_path)
    figures = evaluate(net)
    figures["train_seconds"] = round(timer(), 1)
    entry = write_manifest_entry(
        out_path,
        {
            "model_type": MODEL_TYPE,
            "command": command_line(),
            "figures": figures,
            "data": "sklearn digits, fixed split (mortred_twisted.data.digits)",
        },
    )
    log(f"figures: {figures}")
    log(f"wrote {out_path} sha256={entry['sha256']} bytes={entry['bytes']}")


if __name__ == "__main__":
    main()
