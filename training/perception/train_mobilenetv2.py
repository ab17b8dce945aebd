"""Train the shipped MOBILENETV2: a small transformers ``MobileNetV2ForImageClassification``
on scikit-learn digits with shift/scale/rotation/contrast/noise/inversion augmentation.

Command (10-30 minutes on one CPU thread, depending on the load)::

    .venv/bin/python -m training.perception.train_mobilenetv2

Writes ``weights/perception/mobilenetv2/`` with ``save_pretrained`` (``config.json``
with ``id2label``, ``model.safetensors``, ``preprocessor_config.json``) and its sha256
``manifest.json`` (with this command and the figures), then prints held-out accuracy
and robust accuracy measured through the served model's preprocessing
(:mod:`training.perception.eval_mobilenetv2`).

Training feeds the network exactly what the image processor produces for a 32 px RGB
picture (grey replicated to three channels, rescaled to ``[0, 1]``, normalised with
mean 0.5 / std 0.5): the augmentation works on ``[0, 1]`` pictures at the input size.
Half of the pictures are inverted (dark ink on a light background), so the network,
not a hand-written preprocessing step, reads both polarities.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from mortred_twisted.data.digits import load_digit_split
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.mortred_v1.classification import MODEL_TYPE
from training.perception.common import WEIGHTS_DIR, Timer, base_parser, command_line, log, setup
from training.perception.eval_mobilenetv2 import evaluate_directory

INPUT_SIZE = 32
# A MobileNetV2 of transformers at width 0.5; output_stride 8 keeps a 4x4 map at 32 px
# (dilated last stages instead of strides), the shape of the network it replaced.
CONFIG = {
    "num_channels": 3,
    "image_size": INPUT_SIZE,
    "depth_multiplier": 0.5,
    "output_stride": 8,
    "finegrained_output": False,
    "classifier_dropout_prob": 0.2,
}
PROCESSOR = {
    "size": {"shortest_edge": INPUT_SIZE},
    "crop_size": {"height": INPUT_SIZE, "width": INPUT_SIZE},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random scale (0.45-1.1), rotation (+-12 deg), shift (digit stays mostly inside),
    contrast and offset, Gaussian noise (sigma 0-0.2), inversion (p = 0.5); returns
    ``[0, 1]`` pictures of the input's shape."""
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
    contrast = torch.empty(n, 1, 1, 1).uniform_(0.4, 1.0, generator=gen)
    offset = torch.empty(n, 1, 1, 1).uniform_(0.0, 0.3, generator=gen) * (1 - contrast)
    sigma = torch.empty(n, 1, 1, 1).uniform_(0.0, 0.2, generator=gen)
    out = out * contrast + offset + torch.randn(out.shape, generator=gen) * sigma
    out = out.clamp(0.0, 1.0)
    invert = (torch.rand(n, 1, 1, 1, generator=gen) < 0.5).float()
    return invert * (1.0 - out) + (1.0 - invert) * out


def to_pixel_values(x: torch.Tensor) -> torch.Tensor:
    """``[0, 1]`` grey ``(N, 1, S, S)`` as the processor's normalised RGB ``(N, 3, S, S)``."""
    return ((x - 0.5) / 0.5).expand(-1, 3, -1, -1)


def build(num_labels: int = 10) -> torch.nn.Module:
    """A fresh network of :data:`CONFIG` with digit labels ``"0"`` … ``"9"``."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    labels = {i: str(i) for i in range(num_labels)}
    config = MobileNetV2Config(
        **CONFIG, num_labels=num_labels, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    return MobileNetV2ForImageClassification(config)


def save(net: torch.nn.Module, out_dir: Path) -> None:
    """``save_pretrained`` the network and its image processor into a fresh ``out_dir``."""
    from transformers import MobileNetV2ImageProcessorPil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    net.save_pretrained(str(out_dir))
    processor = MobileNetV2ImageProcessorPil(**PROCESSOR)
    processor.save_pretrained(str(out_dir))


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    gen = setup(args.seed, args.threads)
    out_dir = args.out or WEIGHTS_DIR / "mobilenetv2"
    images, labels = load_digit_split(INPUT_SIZE, "train")
    x_all = torch.from_numpy(images).unsqueeze(1)
    y_all = torch.from_numpy(labels)
    net = build()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps)
    timer = Timer()
    net.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x_all.shape[0], (args.batch,), generator=gen)
        logits = net(pixel_values=to_pixel_values(augment(x_all[idx], gen))).logits
        loss = F.cross_entropy(logits, y_all[idx], label_smoothing=0.05)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps:
            log(f"step {step}/{args.steps} loss {loss.item():.4f} t={timer():.0f}s")
    net.eval()
    train_seconds = round(timer(), 1)
    save(net, out_dir)
    write_manifest(out_dir, {"model_type": MODEL_TYPE})
    figures = evaluate_directory(out_dir)
    figures["train_seconds"] = train_seconds
    data = write_manifest(
        out_dir,
        {
            "model_type": MODEL_TYPE,
            "command": command_line(),
            "figures": figures,
            "data": "sklearn digits, fixed split (mortred_twisted.data.digits)",
        },
    )
    log(f"figures: {figures}")
    log(f"wrote {out_dir}: {len(data['files'])} files")


if __name__ == "__main__":
    main()
