"""Train the shipped SAM_AMG: a small transformers ``SamModel`` on the synthetic scenes.

Commands (the shipped model: two stages, ~45 + 88 minutes on one CPU thread)::

    .venv/bin/python -m training.perception.train_sam --out /tmp/sam_p4 --no-eval
    .venv/bin/python -m training.perception.train_sam --patch 2 --init /tmp/sam_p4 \
        --max-minutes 88 --steps 100000

The first trains over 4 px patches (a 16x16 embedding, masks too coarse for the
11-29 px shapes: IoU 0.751); the second warm-starts the same network over 2 px patches
(:func:`warm_start`) and trains it for a time budget.

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

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mortred_twisted.data.scenes import Scene, scene_split
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.mortred_v1.mask_generation import MODEL_TYPE
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup

SCENE_SIZE = 64  # the synthetic scenes' size
DIM = 64


def sam_config(input_size: int = 64, patch: int = 4) -> dict[str, Any]:
    """SAM's three parts at a fraction of ViT-B's size: a 4-layer ViT (windowed
    attention with two global layers, as SAM) over ``patch`` px patches -> an
    ``input_size / patch`` embedding grid; SAM's prompt encoder and two-way-transformer
    mask decoder at width 64 (whose masks are 4x the grid)."""
    return {
        "vision_config": {
            "hidden_size": DIM,
            "output_channels": DIM,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "image_size": input_size,
            "patch_size": patch,
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
            "image_size": input_size,
            "patch_size": patch,
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


def processor_config(input_size: int = 64, patch: int = 4) -> dict[str, Any]:
    """The ``SamImageProcessor`` settings matching :func:`sam_config`."""
    grid = input_size // patch
    return {
        "size": {"longest_edge": input_size},
        "pad_size": {"height": input_size, "width": input_size},
        "mask_size": {"longest_edge": grid},
        "mask_pad_size": {"height": grid, "width": grid},
    }


IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]


def build(input_size: int = 64, patch: int = 4) -> torch.nn.Module:
    """A fresh ``SamModel`` of :func:`sam_config`.

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

    net = SamModel(SamConfig(**sam_config(input_size, patch)))
    for module in net.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Conv2d | torch.nn.ConvTranspose2d):
            module.reset_parameters()
    pe = net.shared_image_embedding.positional_embedding
    with torch.no_grad():
        pe.copy_(torch.randn(pe.shape))
    pe.requires_grad_(False)
    return net


def warm_start(net: torch.nn.Module, source: Path) -> list[str]:
    """Copy the ``SamModel`` in ``source`` into ``net`` of another patch size.

    The prompt encoder, the mask decoder and the ViT blocks do not depend on the patch
    size and are copied; the absolute position embedding and the global layers'
    relative positions are resized (linearly, as transformers does for relative
    positions); the patch projection is folded (each ``p x p`` kernel block summed) so
    that a patch of the finer grid gives the features the source gives on the picture
    upsampled to the finer grid. Returns the names left at their fresh init.
    """
    from safetensors.torch import load_file

    theirs = load_file(str(source / "model.safetensors"))
    shared = theirs.get("shared_image_embedding.positional_embedding")
    ours = net.state_dict()
    fresh = []
    for name, tensor in ours.items():
        src = theirs.get(name)
        if src is None and name.endswith("shared_embedding.positional_embedding"):
            src = shared  # tied to shared_image_embedding, saved once
        if src is None:
            fresh.append(name)
        elif src.shape == tensor.shape:
            ours[name] = src
        elif name.endswith("vision_encoder.pos_embed"):
            resized = F.interpolate(
                src.permute(0, 3, 1, 2), size=tensor.shape[1:3], mode="bilinear"
            )
            ours[name] = resized.permute(0, 2, 3, 1)
        elif "rel_pos" in name:
            resized = F.interpolate(src.T[None], size=tensor.shape[0], mode="linear")
            ours[name] = resized[0].T
        elif (
            name.endswith("patch_embed.projection.weight") and src.shape[-1] % tensor.shape[-1] == 0
        ):
            f = src.shape[-1] // tensor.shape[-1]
            ours[name] = F.avg_pool2d(src, f) * f * f
        else:
            fresh.append(name)
    net.load_state_dict(ours)
    return fresh


def save(net: torch.nn.Module, out_dir: Path, processor: dict[str, Any]) -> None:
    """``save_pretrained`` the model and its image processor into a fresh ``out_dir``."""
    from transformers import SamImageProcessorPil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    net.save_pretrained(str(out_dir))
    SamImageProcessorPil(**processor).save_pretrained(str(out_dir))


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


def lr_factor(progress: float, warmup: float = 0.05) -> float:
    """One-cycle shape over ``progress`` in ``[0, 1]``: linear warm-up, cosine decay."""
    if progress < warmup:
        return 0.04 + 0.96 * progress / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup)))) + 1e-3


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=3600)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop after this long; the learning-rate schedule follows time or steps, "
        "whichever is further along",
    )
    parser.add_argument("--images", type=int, default=8, help="scenes per step")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per scene")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--input-size", type=int, default=64, help="model input (px)")
    parser.add_argument("--patch", type=int, default=4, help="ViT patch size (px)")
    parser.add_argument("--init", type=Path, default=None, help="warm start from this dir")
    parser.add_argument("--train-scenes", type=int, default=4000)
    parser.add_argument("--val-scenes", type=int, default=100)
    parser.add_argument("--no-eval", action="store_true", help="skip the val evaluation")
    args = parser.parse_args()
    setup(args.seed, args.threads)
    rng = np.random.default_rng(args.seed)
    out_dir = args.out or WEIGHTS_DIR / "sam_amg"
    scenes = scene_split("train", args.train_scenes, SCENE_SIZE)
    net = build(args.input_size, args.patch)
    if args.init is not None:
        log(f"warm start from {args.init}; fresh: {warm_start(net, args.init)}")
    opt = torch.optim.AdamW(
        [p for p in net.parameters() if p.requires_grad], lr=args.lr, weight_decay=1e-4
    )
    budget = None if args.max_minutes is None else 60 * args.max_minutes
    timer = Timer()
    net.train()
    scale = args.input_size / SCENE_SIZE
    low_res = 4 * (args.input_size // args.patch)
    labels = torch.ones(args.images, args.prompts, 1, dtype=torch.long)
    step = 0
    while step < args.steps and (budget is None or timer() < budget):
        step += 1
        progress = step / args.steps
        if budget is not None:
            progress = max(progress, timer() / budget)
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(progress)
        batch = [scenes[i] for i in rng.integers(0, len(scenes), args.images)]
        points, targets = sample_prompts(batch, args.prompts, rng)
        images = (
            torch.from_numpy(np.stack([s.image for s in batch])).permute(0, 3, 1, 2).float() / 255
        )
        images, target, pts = flip_batch(
            images, torch.from_numpy(targets).float(), torch.from_numpy(points), rng
        )
        if scale != 1:
            images = F.interpolate(images, scale_factor=scale, mode="bilinear")
            pts = pts * scale
        if target.shape[-1] != low_res:
            target = F.interpolate(target[:, None], size=(low_res, low_res), mode="nearest")[:, 0]
        embeddings = net.get_image_embeddings((images - IMAGENET_MEAN) / IMAGENET_STD)
        out = net(
            image_embeddings=embeddings,
            input_points=pts.reshape(args.images, args.prompts, 1, 2),
            input_labels=labels,
            multimask_output=True,
        )
        masks = out.pred_masks.flatten(0, 1)  # (P, K, L, L)
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
        if step % 25 == 0:
            best = actual_iou.max(1).values[target.flatten(1).sum(-1) > 0].mean().item()
            log(
                f"step {step} loss {loss.item():.4f} mask {loss_mask.item():.4f} "
                f"iou {loss_iou.item():.4f} best-iou {best:.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} t={timer():.0f}s"
            )
    net.eval()
    train_seconds = round(timer(), 1)
    log(f"trained {step} steps in {train_seconds} s")
    save(net, out_dir, processor_config(args.input_size, args.patch))
    entry = {
        "model_type": MODEL_TYPE,
        "command": command_line(),
        "data": f"mortred_twisted.data.scenes train split, {args.train_scenes} scenes",
        "train_steps": step,
        "train_seconds": train_seconds,
    }
    write_manifest(out_dir, entry)
    log(f"wrote {out_dir}")
    if args.no_eval:
        return
    from training.perception.eval_sam_amg import evaluate_directory

    figures = evaluate_directory(out_dir, args.val_scenes)
    write_manifest(out_dir, {**entry, "figures": figures})
    log(f"figures: {figures}")


if __name__ == "__main__":
    main()
