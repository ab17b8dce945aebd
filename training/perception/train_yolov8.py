"""Train YOLOV8 on the synthetic shape scenes (train split), evaluate on val.

Command (15-30 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_yolov8

Writes ``weights/perception/yolov8_shapes.pt`` and its manifest entry; prints the val
mAP@0.5 and mAP@0.5:0.95 (see :mod:`training.perception.eval_yolov8`).
Augmentation: random horizontal/vertical flips and 90 degree rotations (the three
shape classes are invariant to them).
"""

from __future__ import annotations

import numpy as np
import torch

from mortred_twisted.data.scenes import CLASS_NAMES, Scene, scene_split
from mortred_twisted.models.weights import write_manifest_entry
from mortred_twisted.models.yolov8.family import MODEL_TYPE, build_network, to_tensor
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup
from training.perception.eval_yolov8 import evaluate
from training.perception.yolo_loss import yolo_loss

ARCH = {
    "num_classes": len(CLASS_NAMES),
    "widths": [16, 32, 64, 96],
    "depth": 1,
    "reg_max": 8,
    "input_size": 64,
}
MAX_OBJECTS = 5


def pack(scenes: list[Scene]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images ``(N, 3, S, S)`` uint8 and padded labels/boxes/valid ``(N, M[, 4])``."""
    n = len(scenes)
    images = torch.from_numpy(np.stack([s.image for s in scenes])).permute(0, 3, 1, 2).contiguous()
    labels = torch.full((n, MAX_OBJECTS), -1, dtype=torch.long)
    boxes = torch.zeros(n, MAX_OBJECTS, 4)
    for i, s in enumerate(scenes):
        k = len(s.labels)
        labels[i, :k] = torch.from_numpy(s.labels)
        boxes[i, :k] = torch.from_numpy(s.boxes)
    return images, labels, boxes, labels >= 0


def augment(
    images: torch.Tensor, boxes: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random flips / transposition applied to a whole batch (boxes follow)."""
    size = images.shape[-1]
    boxes = boxes.clone()
    if torch.rand(1, generator=gen).item() < 0.5:  # horizontal flip
        images = images.flip(-1)
        boxes[..., [0, 2]] = size - boxes[..., [2, 0]]
    if torch.rand(1, generator=gen).item() < 0.5:  # vertical flip
        images = images.flip(-2)
        boxes[..., [1, 3]] = size - boxes[..., [3, 1]]
    if torch.rand(1, generator=gen).item() < 0.5:  # transpose (with flips: all 90 deg turns)
        images = images.transpose(-1, -2)
        boxes = boxes[..., [1, 0, 3, 2]]
    return images, boxes


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--train-scenes", type=int, default=6000)
    parser.add_argument("--val-scenes", type=int, default=500)
    args = parser.parse_args()
    gen = setup(args.seed, args.threads)
    out_path = args.out or WEIGHTS_DIR / "yolov8_shapes.pt"
    images, labels, boxes, valid = pack(scene_split("train", args.train_scenes, ARCH["input_size"]))
    net = build_network(ARCH)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1
    )
    timer = Timer()
    net.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, images.shape[0], (args.batch,), generator=gen)
        x, b = augment(images[idx], boxes[idx], gen)
        x = to_tensor(x.permute(0, 2, 3, 1).contiguous().numpy())
        loss, parts = yolo_loss(net, net(x), labels[idx], b, valid[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps:
            log(f"step {step}/{args.steps} loss {loss.item():.3f} {parts} t={timer():.0f}s")
    net.eval()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"arch": ARCH, "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}},
        out_path,
    )
    figures = evaluate(net, args.val_scenes)
    figures["train_seconds"] = round(timer(), 1)
    entry = write_manifest_entry(
        out_path,
        {
            "model_type": MODEL_TYPE,
            "command": command_line(),
            "figures": figures,
            "data": f"mortred_twisted.data.scenes train split, {args.train_scenes} scenes",
        },
    )
    log(f"figures: {figures}")
    log(f"wrote {out_path} sha256={entry['sha256']} bytes={entry['bytes']}")


if __name__ == "__main__":
    main()
