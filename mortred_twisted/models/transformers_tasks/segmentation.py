"""``task = "image-segmentation"`` (semantic): any ``AutoModelForSemanticSegmentation``
directory (SegFormer, DPT, BEiT, MobileViT, UperNet without timm, …).

Input: ``image``. Output: ``{"label_map": <PNG result file>, "labels": [{"id",
"label", "pixels"}], "width", "height"}``: the label map has the picture's size,
each pixel the class id (8-bit grey PNG when there are at most 256 classes, else
16-bit), from the processor's ``post_process_semantic_segmentation`` at the
picture's size; ``labels`` lists the classes present, most pixels first. Batched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.transformers_tasks.common import (
    COMMON_OPTIONS,
    check_options,
    forward_groups,
    label_names,
    load_parts,
    run_items,
)
from mortred_twisted.sdk import Context, Image, Input, ServedModel


@dataclass
class Segmentation:
    """A class id per pixel (``label_map``) and the classes present."""

    label_map: Image
    labels: list[dict[str, Any]]
    width: int
    height: int


def label_map_png(ids: np.ndarray) -> Image:
    """``ids`` (H×W class ids) as an 8-bit PNG when they fit, else 16-bit."""
    from PIL import Image as PILImage

    if int(ids.max(initial=0)) < 256:
        return Image.from_pil(PILImage.fromarray(ids.astype(np.uint8), mode="L"))
    return Image.from_pil(PILImage.fromarray(ids.astype(np.uint16)))


class SemanticSegmenter(ServedModel):
    """Labels every pixel of a picture with a transformers semantic segmenter."""

    max_batch_size = 8

    def setup(self) -> None:
        check_options(self.options, COMMON_OPTIONS)
        self.parts = load_parts(self.options, self.root, "AutoModelForSemanticSegmentation")
        if not hasattr(self.parts.processor, "post_process_semantic_segmentation"):
            raise ModelLoadError(
                f"{self.parts.directory}: the image processor "
                f"{type(self.parts.processor).__name__} has no semantic-segmentation "
                "post-processing"
            )
        self.labels = label_names(self.parts.config)
        if len(self.labels) > 65536:
            raise ModelLoadError("more than 65,536 classes do not fit a 16-bit label map")

    def predict(
        self, ctx: Context, image: Image = Input(description="the picture")
    ) -> Segmentation:
        out = self.predict_batch(ctx, [{"image": image}])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        return run_items(items, self._segment)

    def _segment(self, pictures: list[Any], items: list[dict[str, Any]]) -> list[Any]:
        model, processor = self.parts.model, self.parts.processor
        placed = forward_groups(self.parts, pictures, lambda batch: model(**batch))
        answers: list[Any] = []
        for picture, (out, row) in zip(pictures, placed, strict=True):
            w, h = picture.size
            one = type(out)(logits=out.logits[row : row + 1].float().cpu())
            ids = processor.post_process_semantic_segmentation(one, target_sizes=[(h, w)])[0]
            ids = ids.cpu().numpy().astype(np.int64)
            counts = np.bincount(ids.ravel(), minlength=len(self.labels))
            present = sorted(np.flatnonzero(counts).tolist(), key=lambda i: (-counts[i], i))
            answers.append(
                Segmentation(
                    label_map=label_map_png(ids),
                    labels=[
                        {"id": int(i), "label": self.labels[i], "pixels": int(counts[i])}
                        for i in present
                    ],
                    width=w,
                    height=h,
                )
            )
        return answers
