"""``task = "object-detection"``: any ``AutoModelForObjectDetection`` directory (DETR,
Conditional/Deformable DETR, RT-DETR, YOLOS, … built without timm).

Inputs: ``image``, ``threshold`` (the lowest score kept, 0..1, default 0.5),
``max_detections`` (1..300, default 100). Output: ``{"boxes": [[x1, y1, x2, y2]],
"labels": [str], "scores": [float], "class_ids": [int], "width", "height"}`` with
boxes in the picture's pixels, highest score first: the directory's own image
processor's ``post_process_object_detection`` at the picture's size. Batched (one
forward pass per preprocessed shape, each item failing alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
class Detections:
    """Boxes ``[x1, y1, x2, y2]`` (picture pixels), highest score first."""

    boxes: list[list[float]]
    labels: list[str]
    scores: list[float]
    class_ids: list[int]
    width: int
    height: int


class RowOutput:
    """One picture's share of a detector's output: the two fields the processors'
    ``post_process_object_detection`` reads (a plain object: building the model's
    own output class per picture costs ~700 Python calls of field checks)."""

    __slots__ = ("logits", "pred_boxes")

    def __init__(self, logits: Any, pred_boxes: Any) -> None:
        self.logits = logits
        self.pred_boxes = pred_boxes


class ObjectDetector(ServedModel):
    """Finds objects in a picture with a transformers detector."""

    max_batch_size = 8

    def setup(self) -> None:
        check_options(self.options, COMMON_OPTIONS)
        self.parts = load_parts(self.options, self.root, "AutoModelForObjectDetection")
        if not hasattr(self.parts.processor, "post_process_object_detection"):
            raise ModelLoadError(
                f"{self.parts.directory}: the image processor "
                f"{type(self.parts.processor).__name__} has no object-detection "
                "post-processing"
            )
        self.labels = label_names(self.parts.config)

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        threshold: float = Input(0.5, ge=0.0, le=1.0, description="lowest score kept"),
        max_detections: int = Input(100, ge=1, le=300, description="boxes returned at most"),
    ) -> Detections:
        item = {"image": image, "threshold": threshold, "max_detections": max_detections}
        out = self.predict_batch(ctx, [item])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        return run_items(items, self._detect)

    def raw_outputs(self, pictures: list[Any]) -> list[Any]:
        """The network's output for each RGB picture (PIL) alone (``logits`` and
        ``pred_boxes`` of one row, float32 on the CPU), in picture order: one forward
        pass per preprocessed shape. The ``mortred-v1`` contract post-processes
        these too (:mod:`..mortred_v1.detection`)."""
        model = self.parts.model
        placed = forward_groups(self.parts, pictures, lambda batch: model(**batch))
        return [
            RowOutput(
                out.logits[row : row + 1].float().cpu(),
                out.pred_boxes[row : row + 1].float().cpu(),
            )
            for out, row in placed
        ]

    def _detect(self, pictures: list[Any], items: list[dict[str, Any]]) -> list[Any]:
        processor = self.parts.processor
        answers: list[Any] = []
        outputs = self.raw_outputs(pictures)
        for picture, one, item in zip(pictures, outputs, items, strict=True):
            w, h = picture.size
            found = processor.post_process_object_detection(
                one, threshold=float(item.get("threshold", 0.5)), target_sizes=[(h, w)]
            )[0]
            order = found["scores"].argsort(descending=True, stable=True)
            order = order[: int(item.get("max_detections", 100))]
            ids = [int(i) for i in found["labels"][order]]
            boxes = found["boxes"][order].clamp(min=0)
            boxes[:, 0::2] = boxes[:, 0::2].clamp(max=w)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(max=h)
            answers.append(
                Detections(
                    boxes=[[round(float(v), 2) for v in box] for box in boxes],
                    labels=[self.labels[i] if 0 <= i < len(self.labels) else str(i) for i in ids],
                    scores=[round(float(s), 6) for s in found["scores"][order]],
                    class_ids=ids,
                    width=w,
                    height=h,
                )
            )
        return answers
