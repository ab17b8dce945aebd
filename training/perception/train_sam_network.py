"""Train our own SAM-shaped promptable segmenter (``network.py``), the shipped SAM_AMG
weights, on the synthetic scenes (the transformers ``SamModel`` is trained by
:mod:`training.perception.train_sam`).

Command (15-40 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_sam_network

Each step embeds a batch of train scenes once and decodes several single-point
prompts per scene: most points fall inside a random instance (target: that
instance's visible mask), some on the background (target: an empty mask, IoU 0, so
that the automatic mask generator filters them by predicted IoU). Loss: pixel-mean binary
cross-entropy + Dice on the best of the three masks (SAM uses focal + Dice; BCE
converges much faster in our short CPU budget), plus MSE between predicted and actual
IoU of all three. Writes ``weights/perception/sam_shapes.pt`` with its
manifest entry, then evaluates the automatic mask generator on the val split
(:mod:`training.perception.eval_sam_amg`) and records the figures.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mortred_twisted.data.scenes import Scene, scene_split
from mortred_twisted.models.classification.weights import write_manifest_entry
from mortred_twisted.models.segment_anything.network import PromptableSegmenter
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup

MODEL_TYPE = "SAM_AMG"
ARCH = {"dim": 64, "num_masks": 3, "depth": 2, "heads": 4, "input_size": 64}


def focal_loss(
    logits: torch.Tensor, target: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> torch.Tensor:
    """Sigmoid focal loss averaged over pixels: ``(P, K, H, W)`` -> ``(P, K)``."""
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    p_t = prob * target + (1 - prob) * (1 - target)
    loss = ce * (1 - p_t) ** gamma
    loss = (alpha * target + (1 - alpha) * (1 - target)) * loss
    return loss.flatten(2).mean(-1)


def bce_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy averaged over pixels: ``(P, K, H, W)`` -> ``(P, K)``."""
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none").flatten(2).mean(-1)


def dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - soft Dice`` per mask: ``(P, K, H, W)`` -> ``(P, K)``."""
    prob = logits.sigmoid().flatten(2)
    t = target.flatten(2)
    return 1 - (2 * (prob * t).sum(-1) + 1) / (prob.sum(-1) + t.sum(-1) + 1)


def sample_prompts(
    scenes: list[Scene], per_image: int, rng: np.random.Generator, background: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Image index ``(P,)``, points ``(P, 2)`` (x, y pixels), target masks ``(P, H, W)``."""
    index, points, targets = [], [], []
    for i, scene in enumerate(scenes):
        union = scene.masks.any(0)
        for _ in range(per_image):
            if len(scene.masks) and rng.random() >= background:
                mask = scene.masks[rng.integers(len(scene.masks))]
            else:
                mask = None
            pool = mask if mask is not None else ~union
            ys, xs = np.nonzero(pool)
            j = rng.integers(len(xs))
            index.append(i)
            points.append((xs[j] + rng.random(), ys[j] + rng.random()))
            targets.append(mask if mask is not None else np.zeros_like(union))
    return np.array(index), np.array(points, np.float32), np.stack(targets)


def flip_batch(
    images: torch.Tensor, masks: torch.Tensor, points: torch.Tensor, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random flips / transposition of images ``(N,3,S,S)``, masks ``(P,S,S)``, points."""
    size = images.shape[-1]
    points = points.clone()
    if rng.random() < 0.5:
        images, masks = images.flip(-1), masks.flip(-1)
        points[:, 0] = size - points[:, 0]
    if rng.random() < 0.5:
        images, masks = images.flip(-2), masks.flip(-2)
        points[:, 1] = size - points[:, 1]
    if rng.random() < 0.5:
        images, masks = images.transpose(-1, -2), masks.transpose(-1, -2)
        points = points[:, [1, 0]]
    return images.contiguous(), masks.contiguous(), points


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=3200)
    parser.add_argument("--images", type=int, default=8, help="scenes per step")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per scene")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train-scenes", type=int, default=4000)
    parser.add_argument("--val-scenes", type=int, default=100)
    args = parser.parse_args()
    setup(args.seed, args.threads)
    rng = np.random.default_rng(args.seed)
    out_path = args.out or WEIGHTS_DIR / "sam_shapes.pt"
    scenes = scene_split("train", args.train_scenes, ARCH["input_size"])
    net = PromptableSegmenter(**ARCH)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05
    )
    timer = Timer()
    net.train()
    for step in range(1, args.steps + 1):
        batch = [scenes[i] for i in rng.integers(0, len(scenes), args.images)]
        index, points, targets = sample_prompts(batch, args.prompts, rng)
        images = (
            torch.from_numpy(np.stack([s.image for s in batch])).permute(0, 3, 1, 2).float() / 255
        )
        images, target, pts = flip_batch(
            images, torch.from_numpy(targets).float(), torch.from_numpy(points), rng
        )
        masks, iou_pred = net.decode(net.embed(images), torch.from_numpy(index), pts)
        target_k = target[:, None].expand_as(masks)
        per_mask = bce_loss(masks, target_k) + dice_loss(masks, target_k)
        loss_mask = per_mask.min(1).values.mean()
        with torch.no_grad():
            binary = masks > 0
            inter = (binary & (target_k > 0.5)).flatten(2).sum(-1).float()
            union = (binary | (target_k > 0.5)).flatten(2).sum(-1).float()
            actual_iou = torch.where(union > 0, inter / union.clamp(min=1), torch.zeros_like(union))
            actual_iou = actual_iou * (target.flatten(1).sum(-1) > 0)[:, None]
        loss_iou = F.mse_loss(iou_pred, actual_iou)
        loss = loss_mask + loss_iou
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps:
            best = actual_iou.max(1).values[target.flatten(1).sum(-1) > 0].mean().item()
            log(
                f"step {step}/{args.steps} loss {loss.item():.4f} mask {loss_mask.item():.4f} "
                f"iou {loss_iou.item():.4f} best-iou {best:.3f} t={timer():.0f}s"
            )
    net.eval()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"arch": ARCH, "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}},
        out_path,
    )
    entry = {
        "model_type": MODEL_TYPE,
        "command": command_line(),
        "data": f"mortred_twisted.data.scenes train split, {args.train_scenes} scenes",
        "train_seconds": round(timer(), 1),
    }
    written = write_manifest_entry(out_path, {**entry, "figures": {}})
    log(f"wrote {out_path} sha256={written['sha256']}")
    from mortred_twisted.models.segment_anything.prompter import NetworkPrompter
    from training.perception.eval_sam_amg import evaluate

    figures = evaluate(NetworkPrompter(net, torch.device("cpu")), args.val_scenes)
    write_manifest_entry(out_path, {**entry, "figures": figures})
    log(f"figures: {figures}")


if __name__ == "__main__":
    main()
