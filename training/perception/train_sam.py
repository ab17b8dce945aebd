"""Train the shipped SAM_AMG: a small transformers ``SamModel`` on the synthetic scenes.

Command (30-60 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_sam

Each step embeds a batch of train scenes once (``get_image_embeddings``) and decodes
several single-point prompts per scene through the prompt encoder and mask decoder:
most points fall inside a random instance (target: that instance's visible mask), some
on the background (target: an empty mask, IoU 0, so that the automatic mask generator
filters them by predicted IoU). Loss: pixel-mean binary cross-entropy + Dice on the
best of the three masks (SAM uses focal + Dice; BCE converges much faster in a short
CPU budget), plus MSE between predicted and actual IoU of all three. Writes
``weights/perception/sam_amg/`` with ``save_pretrained`` (``config.json``,
``model.safetensors``, ``preprocessor_config.json``) and its sha256 ``manifest.json``,
then evaluates the automatic mask generator on the val split
(:mod:`training.perception.eval_sam_amg`) and records the figures.

The network sees what the ``SamImageProcessor`` produces for a 64 px picture: RGB
rescaled to ``[0, 1]`` and normalised with ImageNet's mean and std.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mortred_twisted.data.scenes import Scene, scene_split
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.segment_anything.sam_amg import MODEL_TYPE
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup

INPUT_SIZE = 64
PATCH = 4
DIM = 64
# SAM's three parts at a fraction of ViT-B's size: a 4-layer ViT (windowed attention
# with two global layers, as SAM) over 4 px patches -> a 16x16 embedding; the prompt
# encoder and the two-way-transformer mask decoder of SAM at width 64.
CONFIG = {
    "vision_config": {
        "hidden_size": DIM,
        "output_channels": DIM,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "image_size": INPUT_SIZE,
        "patch_size": PATCH,
        "mlp_dim": 4 * DIM,
        "window_size": 8,
        "global_attn_indexes": [1, 3],
        "num_pos_feats": DIM // 2,
        # transformers' SamVisionConfig default is 1e-10 (checkpoints overwrite it):
        # an encoder trained from scratch needs ViT's usual 0.02.
        "initializer_range": 0.02,
    },
    "prompt_encoder_config": {
        "hidden_size": DIM,
        "image_size": INPUT_SIZE,
        "patch_size": PATCH,
        "mask_input_channels": 4,
    },
    "mask_decoder_config": {
        "hidden_size": DIM,
        "mlp_dim": 4 * DIM,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "iou_head_hidden_dim": DIM,
    },
}
PROCESSOR = {
    "size": {"longest_edge": INPUT_SIZE},
    "pad_size": {"height": INPUT_SIZE, "width": INPUT_SIZE},
    "mask_size": {"longest_edge": INPUT_SIZE // 4},
    "mask_pad_size": {"height": INPUT_SIZE // 4, "width": INPUT_SIZE // 4},
}
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]


def build() -> torch.nn.Module:
    """A fresh ``SamModel`` of :data:`CONFIG`.

    Linear and convolution layers start from torch's default (fan-in scaled) init:
    with transformers' N(0, 0.02) everywhere the mask logits of this narrow model start
    near 1e-3 and training only learns the empty mask.
    The random Fourier features that encode point and pixel positions are drawn with
    SAM's scale 1 and frozen, as in SAM (a buffer there): transformers initialises them
    with std ``hidden_size // 2`` (harmless when a checkpoint overwrites them), and at
    std 32 neighbouring embedding cells get unrelated codes, so a point prompt cannot
    be matched to the image (training stalls at empty masks).
    """
    from transformers import SamConfig, SamModel

    net = SamModel(SamConfig(**CONFIG))
    for module in net.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Conv2d | torch.nn.ConvTranspose2d):
            module.reset_parameters()
    pe = net.shared_image_embedding.positional_embedding
    with torch.no_grad():
        pe.copy_(torch.randn(pe.shape))
    pe.requires_grad_(False)
    return net


def save(net: torch.nn.Module, out_dir: Path) -> None:
    """``save_pretrained`` the model and its image processor into a fresh ``out_dir``."""
    from transformers import SamImageProcessorPil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    net.save_pretrained(str(out_dir))
    SamImageProcessorPil(**PROCESSOR).save_pretrained(str(out_dir))


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
) -> tuple[np.ndarray, np.ndarray]:
    """Points ``(N * per_image, 2)`` (x, y continuous pixels, scene-major) and their
    target masks ``(N * per_image, H, W)``."""
    points, targets = [], []
    for scene in scenes:
        union = scene.masks.any(0)
        for _ in range(per_image):
            if len(scene.masks) and rng.random() >= background:
                mask = scene.masks[rng.integers(len(scene.masks))]
            else:
                mask = None
            pool = mask if mask is not None else ~union
            ys, xs = np.nonzero(pool)
            j = rng.integers(len(xs))
            points.append((xs[j] + rng.random(), ys[j] + rng.random()))
            targets.append(mask if mask is not None else np.zeros_like(union))
    return np.array(points, np.float32), np.stack(targets)


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
    parser.add_argument("--steps", type=int, default=3600)
    parser.add_argument("--images", type=int, default=8, help="scenes per step")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per scene")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-scenes", type=int, default=4000)
    parser.add_argument("--val-scenes", type=int, default=100)
    args = parser.parse_args()
    setup(args.seed, args.threads)
    rng = np.random.default_rng(args.seed)
    out_dir = args.out or WEIGHTS_DIR / "sam_amg"
    scenes = scene_split("train", args.train_scenes, INPUT_SIZE)
    net = build()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05
    )
    timer = Timer()
    net.train()
    labels = torch.ones(args.images, args.prompts, 1, dtype=torch.long)
    for step in range(1, args.steps + 1):
        batch = [scenes[i] for i in rng.integers(0, len(scenes), args.images)]
        points, targets = sample_prompts(batch, args.prompts, rng)
        images = (
            torch.from_numpy(np.stack([s.image for s in batch])).permute(0, 3, 1, 2).float() / 255
        )
        images, target, pts = flip_batch(
            images, torch.from_numpy(targets).float(), torch.from_numpy(points), rng
        )
        embeddings = net.get_image_embeddings((images - IMAGENET_MEAN) / IMAGENET_STD)
        out = net(
            image_embeddings=embeddings,
            input_points=pts.reshape(args.images, args.prompts, 1, 2),
            input_labels=labels,
            multimask_output=True,
        )
        masks = out.pred_masks.flatten(0, 1)  # (P, K, S, S)
        iou_pred = out.iou_scores.flatten(0, 1)
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
    train_seconds = round(timer(), 1)
    save(net, out_dir)
    entry = {
        "model_type": MODEL_TYPE,
        "command": command_line(),
        "data": f"mortred_twisted.data.scenes train split, {args.train_scenes} scenes",
        "train_seconds": train_seconds,
    }
    write_manifest(out_dir, entry)
    log(f"wrote {out_dir}")
    from training.perception.eval_sam_amg import evaluate_directory

    figures = evaluate_directory(out_dir, args.val_scenes)
    write_manifest(out_dir, {**entry, "figures": figures})
    log(f"figures: {figures}")


if __name__ == "__main__":
    main()
