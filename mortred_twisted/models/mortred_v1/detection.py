"""Object detection with the seed's contract (``OBJECT_DETECTION``, the ``RTDETR``
entry): an adapter over the task model
:class:`~mortred_twisted.models.transformers_tasks.detection.ObjectDetector`.

The directory (``pretrained``, default the shipped RT-DETR) must match its
``manifest.json``; the task model loads it and runs the network (one forward pass
per preprocessed shape over every picture of the batch). The adapter maps:

* the envelope's ``images`` onto the task's pictures (several per request);
* the params of YOLOV8 (``model_score_threshold``, ``model_nms_threshold``,
  ``model_keep_top_k``; the server file's options are their defaults) onto the
  post-processing: the processor's ``post_process_object_detection`` at the score
  threshold and the picture's size, class-agnostic greedy NMS, the top k, boxes
  clipped to the picture;
* the result onto YOLOV8's ``data``: per picture ``[{"class_id", "score",
  "category", "bbox": [x1, y1, x2, y2]}]`` by decreasing score; several pictures:
  ``{"results": [...]}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image as PILImage

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.models.box_ops import nms
from mortred_twisted.models.mortred_v1.common import fan_out, task_instance
from mortred_twisted.models.pretrained import verified_directory
from mortred_twisted.models.schemas import DETECTION_OUTPUT
from mortred_twisted.models.transformers_tasks.detection import ObjectDetector
from mortred_twisted.models.yolov8.family import (
    IMAGES,
    KEEP_TOP_K,
    NMS_THRESHOLD,
    SCORE_THRESHOLD,
    detection_records,
    settings_of,
    threshold_options,
)
from mortred_twisted.sdk import Context, Image, ServedModel

MODEL_TYPE = "OBJECT_DETECTION"
DEFAULT_PRETRAINED = "weights/perception/rtdetr"
OPTIONS = (
    "pretrained",
    "device",
    "model_score_threshold",
    "model_nms_threshold",
    "model_keep_top_k",
)

Detections = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class ObjectDetectionModel(ServedModel):
    """The seed's detector over a transformers detector (RT-DETR, DETR, YOLOS, …)."""

    contract = "mortred-v1"
    output_schema = DETECTION_OUTPUT

    task: ObjectDetector
    class_names: list[str]
    defaults: dict[str, Any]

    def setup(self) -> None:
        """Verify the directory against its manifest and set the task model up on it.
        Options: ``pretrained``, ``device``, ``model_score_threshold`` (0.25),
        ``model_nms_threshold`` (0.45), ``model_keep_top_k`` (100). Raises
        :class:`ModelLoadError`."""
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: {list(OPTIONS)}"
            )
        self.defaults = threshold_options(self.options)
        directory = verified_directory(self.options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        options = {"pretrained": str(directory), "device": self.options.get("device", "cpu")}
        self.task = task_instance(ObjectDetector, options, self.root)
        self.class_names = self.task.labels

    def forward(self, pictures: Sequence[PILImage.Image]) -> list[Any]:
        """The network's output of each RGB picture (the task model's)."""
        return self.task.raw_outputs(list(pictures))

    def postprocess(
        self,
        one: Any,
        picture: PILImage.Image,
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> Detections:
        """One picture's output -> ``(boxes (K, 4) xyxy in its pixels, scores (K,),
        class_ids (K,))``, highest score first."""
        height, width = picture.height, picture.width
        result = self.task.parts.processor.post_process_object_detection(
            one, threshold=score_threshold, target_sizes=[(height, width)]
        )[0]
        boxes, scores = result["boxes"].float(), result["scores"].float()
        labels = result["labels"].long()
        order = scores.argsort(descending=True, stable=True)
        boxes, scores, labels = boxes[order], scores[order], labels[order]
        kept = nms(boxes, scores, nms_threshold)[:keep_top_k]
        boxes = boxes[kept].clone()
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        return boxes, scores[kept], labels[kept]

    def detect(
        self,
        pictures: Sequence[PILImage.Image],
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> list[Detections]:
        """:meth:`postprocess` of each picture's output (for tools: the evaluation)."""
        outputs = self.forward(pictures)
        settings = (score_threshold, nms_threshold, keep_top_k)
        return [
            self.postprocess(one, p, *settings) for one, p in zip(outputs, pictures, strict=True)
        ]

    def predict(
        self,
        ctx: Context,
        images: list[Image] = IMAGES,
        model_score_threshold: float = SCORE_THRESHOLD,
        model_nms_threshold: float = NMS_THRESHOLD,
        model_keep_top_k: int = KEEP_TOP_K,
    ) -> Any:
        """Detect objects in the request's images."""
        ctx.check_cancelled()
        item = {
            "images": images,
            "model_score_threshold": model_score_threshold,
            "model_nms_threshold": model_nms_threshold,
            "model_keep_top_k": model_keep_top_k,
        }
        out = self.predict_batch(ctx, [item])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Context, items: list[dict[str, Any]]) -> list[Any]:
        """Every request's pictures through the network in one call; each request
        fails alone."""

        def run(flat: list[PILImage.Image]) -> list[tuple[Any, PILImage.Image]]:
            return list(zip(self.forward(flat), flat, strict=True))

        out = fan_out(items, run, self._data)
        ctx.progress(1, 1)
        return out

    def _data(self, item: Mapping[str, Any], outs: Sequence[tuple[Any, PILImage.Image]]) -> Any:
        settings = settings_of(self.defaults, item)
        results = [
            detection_records(*self.postprocess(one, picture, *settings), self.class_names)
            for one, picture in outs
        ]
        return results[0] if len(results) == 1 else {"results": results}


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One detector set up and served through the SDK, without input limits (the
    registry's ``create_model`` sets the configured ones); for tests and tools."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(ObjectDetectionModel, options, root)
