"""Evaluate the shipped MOBILENETV2 on the held-out digits, plain and robust.

Command (seconds)::

    .venv/bin/python -m training.perception.eval_mobilenetv2 [--pretrained DIR]

Loads the manifest-verified transformers directory through the served model's
``create`` and classifies RGB pictures through its image processor, exactly as a
request would be served, and prints:

* ``heldout_acc``: the 359 held-out digits rendered at 32 px;
* ``robust_acc``: each held-out digit 3 times (seeded), scaled 0.8-1.2x, pasted at a
  random spot of a 48 px canvas with Gaussian noise (sigma 0.1), the canvas resized to
  the 32 px input - 1,077 pictures;
* ``inverted_acc``: the held-out digits drawn dark on a light background.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mortred_twisted.data.digits import load_digit_split
from mortred_twisted.data.scenes import render_digit_canvas
from mortred_twisted.models.mortred_v1.classification import (
    ImageClassificationModel,
    create,
)
from training.perception.common import ROOT, base_parser, setup

INPUT_SIZE = 32
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


def to_rgb(grey: np.ndarray) -> Image.Image:
    """A ``[0, 1]`` grey picture as the 8-bit RGB picture a client would send."""
    u8 = (np.clip(grey, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return Image.fromarray(np.repeat(u8[..., None], 3, axis=2))


@torch.inference_mode()
def accuracy(model: ImageClassificationModel, grey: np.ndarray, labels: np.ndarray) -> float:
    """Share of pictures whose served top class is the label (batches of 256)."""
    hits = 0
    for start in range(0, len(grey), 256):
        pictures = [to_rgb(g) for g in grey[start : start + 256]]
        scores = model.probabilities(pictures)
        hits += int((scores.argmax(1) == labels[start : start + 256]).sum())
    return hits / len(grey)


def evaluate(model: ImageClassificationModel) -> dict[str, float]:
    """Figures of a served classifier: held-out, robust and inverted accuracy."""
    test_x, test_y = load_digit_split(INPUT_SIZE, "test")
    rob_x, rob_y = robust_set(INPUT_SIZE)
    return {
        "heldout_acc": round(accuracy(model, test_x, test_y), 4),
        "robust_acc": round(accuracy(model, rob_x, rob_y), 4),
        "inverted_acc": round(accuracy(model, 1.0 - test_x, test_y), 4),
        "heldout_n": len(test_y),
        "robust_n": len(rob_y),
    }


def evaluate_directory(directory: Path) -> dict[str, float]:
    """:func:`evaluate` of the verified checkpoint directory ``directory``."""
    return evaluate(create({"pretrained": str(directory)}, ROOT).instance)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--pretrained", default="weights/perception/mobilenetv2")
    args = parser.parse_args()
    setup(args.seed, args.threads)
    model = create({"pretrained": args.pretrained}, ROOT).instance  # the served family
    print(json.dumps(evaluate(model), indent=2))


if __name__ == "__main__":
    main()
