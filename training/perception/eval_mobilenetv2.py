"""Evaluate MOBILENETV2 on the held-out digits, plain and robust.

Command (seconds)::

    .venv/bin/python -m training.perception.eval_mobilenetv2

Loads the shipped, manifest-verified weights through the served model's ``create``
and its serving preprocessing, and prints:

* ``heldout_acc``: the 360 held-out digits rendered at 32 px;
* ``robust_acc``: each held-out digit 3 times (seeded), scaled 0.8-1.2x, pasted at a
  random spot of a 48 px canvas with Gaussian noise (sigma 0.1), the canvas resized to
  the 32 px input - 1080 pictures.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from PIL import Image

from mortred_twisted.data.digits import load_digit_split
from mortred_twisted.data.scenes import render_digit_canvas
from mortred_twisted.models.classification.mobilenetv2 import create, preprocess_grey
from training.perception.common import ROOT, base_parser, setup

ROBUST_SEED = 1234
ROBUST_REPEATS = 3
ROBUST_CANVAS = 48


def robust_set(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Held-out digits on the larger noisy canvas, as ``[0, 1]`` grey at ``size`` px."""
    images, labels = load_digit_split(size, "test")
    rng = np.random.default_rng(ROBUST_SEED)
    out, ys = [], []
    for _ in range(ROBUST_REPEATS):
        for img, y in zip(images, labels, strict=True):
            canvas = render_digit_canvas(img, rng, ROBUST_CANVAS, (0.8, 1.2), 0.1)
            pil = Image.fromarray(canvas, mode="F").resize((size, size), Image.BILINEAR)
            out.append(np.asarray(pil, np.float32))
            ys.append(y)
    return np.stack(out), np.array(ys)


@torch.inference_mode()
def _accuracy(net: torch.nn.Module, grey: np.ndarray, labels: np.ndarray, size: int) -> float:
    x = np.stack([preprocess_grey(g, size) for g in grey])
    logits = net(torch.from_numpy(x).unsqueeze(1))
    return float((logits.argmax(1).numpy() == labels).mean())


def evaluate(net: torch.nn.Module) -> dict[str, float]:
    """Figures of an (eval-mode) network: held-out and robust accuracy."""
    size = net.input_size
    net.eval()
    test_x, test_y = load_digit_split(size, "test")
    rob_x, rob_y = robust_set(size)
    return {
        "heldout_acc": round(_accuracy(net, test_x, test_y, size), 4),
        "robust_acc": round(_accuracy(net, rob_x, rob_y, size), 4),
        "heldout_n": len(test_y),
        "robust_n": len(rob_y),
    }


def main() -> None:
    args = base_parser(__doc__ or "").parse_args()
    setup(args.seed, args.threads)
    model = create({}, ROOT)
    print(json.dumps(evaluate(model.net), indent=2))


if __name__ == "__main__":
    main()
