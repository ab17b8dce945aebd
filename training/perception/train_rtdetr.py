"""Train the shipped RTDETR: a small transformers ``RTDetrForObjectDetection`` (its own
ResNet backbone, no timm) on the synthetic shape scenes of YOLOV8.

Command (30-60 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_rtdetr

Writes ``weights/perception/rtdetr/`` with ``save_pretrained`` (``config.json`` with
``id2label``, ``model.safetensors``, ``preprocessor_config.json``) and its sha256
``manifest.json`` (with this command and the figures), then prints the val mAP
measured through the served model (:mod:`training.perception.eval_rtdetr`).

The loss is transformers' own RT-DETR loss (Hungarian matching, varifocal + L1 + GIoU,
auxiliary and denoising groups). Augmentation: random flips and transposition of the
whole batch, as for YOLOV8. The network sees what the image processor produces for a
64 px picture: RGB rescaled to ``[0, 1]``.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

from mortred_twisted.data.scenes import CLASS_NAMES, scene_split
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.mortred_v1.detection import MODEL_TYPE
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup
from training.perception.eval_rtdetr import evaluate_directory
from training.perception.train_yolov8 import augment, pack

INPUT_SIZE = 64
# RT-DETR r18's shape (basic residual blocks, hybrid encoder, 3 decoder layers) at a
# fraction of its width; feature levels at strides 4/8/16 because the shapes are
# 11-29 px on 64 px pictures (r18 uses 8/16/32 on 640 px).
BACKBONE = {
    "embedding_size": 16,
    "hidden_sizes": [16, 32, 64, 96],
    "depths": [1, 1, 1, 1],
    "layer_type": "basic",
    "out_features": ["stage1", "stage2", "stage3"],
}
CONFIG = {
    "freeze_backbone_batch_norms": False,
    "encoder_in_channels": [16, 32, 64],
    "feat_strides": [4, 8, 16],
    "encoder_hidden_dim": 64,
    "encoder_ffn_dim": 128,
    "encoder_attention_heads": 4,
    "hidden_expansion": 0.5,
    "d_model": 64,
    "decoder_in_channels": [64, 64, 64],
    "decoder_ffn_dim": 128,
    "decoder_layers": 3,
    "decoder_attention_heads": 4,
    "num_queries": 30,
    "num_denoising": 30,
}
PROCESSOR = {
    "size": {"height": INPUT_SIZE, "width": INPUT_SIZE},
    "do_normalize": False,
}


def build() -> torch.nn.Module:
    """A fresh network of :data:`CONFIG` with the shape class names."""
    from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrResNetConfig

    labels = dict(enumerate(CLASS_NAMES))
    config = RTDetrConfig(
        backbone_config=RTDetrResNetConfig(**BACKBONE),
        **CONFIG,
        num_labels=len(labels),
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    return RTDetrForObjectDetection(config)


def save(net: torch.nn.Module, out_dir: Path) -> None:
    """``save_pretrained`` the network and its image processor into a fresh ``out_dir``."""
    from transformers import RTDetrImageProcessorPil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    net.save_pretrained(str(out_dir))
    RTDetrImageProcessorPil(**PROCESSOR).save_pretrained(str(out_dir))


def targets(
    labels: torch.Tensor, boxes: torch.Tensor, valid: torch.Tensor
) -> list[dict[str, torch.Tensor]]:
    """Padded ``xyxy`` pixel boxes -> transformers' per-picture ``class_labels`` and
    normalised ``cx, cy, w, h`` boxes."""
    out = []
    for lab, box, ok in zip(labels, boxes, valid, strict=True):
        b = box[ok] / INPUT_SIZE
        cxcywh = torch.stack(
            [
                (b[:, 0] + b[:, 2]) / 2,
                (b[:, 1] + b[:, 3]) / 2,
                b[:, 2] - b[:, 0],
                b[:, 3] - b[:, 1],
            ],
            dim=1,
        )
        out.append({"class_labels": lab[ok], "boxes": cxcywh})
    return out


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--train-scenes", type=int, default=6000)
    parser.add_argument("--val-scenes", type=int, default=500)
    args = parser.parse_args()
    gen = setup(args.seed, args.threads)
    out_dir = args.out or WEIGHTS_DIR / "rtdetr"
    images, labels, boxes, valid = pack(scene_split("train", args.train_scenes, INPUT_SIZE))
    net = build()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    warmup = max(1, args.steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    timer = Timer()
    net.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, images.shape[0], (args.batch,), generator=gen)
        x, b = augment(images[idx], boxes[idx], gen)
        out = net(pixel_values=x.float() / 255.0, labels=targets(labels[idx], b, valid[idx]))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.1)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps:
            log(f"step {step}/{args.steps} loss {out.loss.item():.3f} t={timer():.0f}s")
    net.eval()
    train_seconds = round(timer(), 1)
    save(net, out_dir)
    write_manifest(out_dir, {"model_type": MODEL_TYPE})
    figures = evaluate_directory(out_dir, args.val_scenes)
    figures["train_seconds"] = train_seconds
    data = write_manifest(
        out_dir,
        {
            "model_type": MODEL_TYPE,
            "command": command_line(),
            "figures": figures,
            "data": f"mortred_twisted.data.scenes train split, {args.train_scenes} scenes",
        },
    )
    log(f"figures: {figures}")
    log(f"wrote {out_dir}: {len(data['files'])} files")


if __name__ == "__main__":
    main()
