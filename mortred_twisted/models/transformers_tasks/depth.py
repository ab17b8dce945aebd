"""``task = "depth-estimation"``: any ``AutoModelForDepthEstimation`` directory (DPT,
GLPN, Depth Anything, ZoeDepth without timm, …).

Input: ``image``. Output: ``{"depth": <16-bit grey PNG result file>, "min", "max",
"width", "height"}``: the model's predicted depth resized (bicubic) to the picture's
size; pixel value ``v`` stands for depth ``min + v / 65535 * (max - min)`` in the
model's own unit (relative depth for most checkpoints). Batched: one forward pass
per preprocessed shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mortred_twisted.models.transformers_tasks.common import (
    COMMON_OPTIONS,
    check_options,
    forward_groups,
    load_parts,
    run_items,
)
from mortred_twisted.sdk import Context, Image, Input, ServedModel


@dataclass
class Depth:
    """The depth map (16-bit PNG scaled to ``[min, max]``) and its range."""

    depth: Image
    min: float
    max: float
    width: int
    height: int


def depth_png(depth: np.ndarray) -> tuple[Image, float, float]:
    """``depth`` (H×W floats) as a 16-bit PNG over its own range, with the range."""
    from PIL import Image as PILImage

    low, high = float(depth.min()), float(depth.max())
    span = high - low
    scaled = np.zeros(depth.shape) if span <= 0 else (depth - low) / span
    pixels = np.rint(scaled * 65535.0).astype(np.uint16)
    return Image.from_pil(PILImage.fromarray(pixels)), low, high


class DepthEstimator(ServedModel):
    """Estimates per-pixel depth of a picture with a transformers depth model."""

    max_batch_size = 8

    def setup(self) -> None:
        check_options(self.options, COMMON_OPTIONS)
        self.parts = load_parts(self.options, self.root, "AutoModelForDepthEstimation")

    def predict(self, ctx: Context, image: Image = Input(description="the picture")) -> Depth:
        out = self.predict_batch(ctx, [{"image": image}])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        return run_items(items, self._estimate)

    def _estimate(self, pictures: list[Any], items: list[dict[str, Any]]) -> list[Any]:
        import torch.nn.functional as F

        model = self.parts.model
        placed = forward_groups(
            self.parts, pictures, lambda batch: model(**batch).predicted_depth.float().cpu()
        )
        answers: list[Any] = []
        for picture, (depths, row) in zip(pictures, placed, strict=True):
            w, h = picture.size
            pred = depths[row]
            if pred.ndim == 2:
                pred = pred[None]
            resized = F.interpolate(pred[None], size=(h, w), mode="bicubic", align_corners=False)
            image, low, high = depth_png(resized[0, 0].numpy())
            answers.append(
                Depth(depth=image, min=round(low, 6), max=round(high, 6), width=w, height=h)
            )
        return answers
