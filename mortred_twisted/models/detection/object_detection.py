"""OBJECT_DETECTION: any transformers object detector (RT-DETR, DETR, Conditional DETR, YOLOS).

The model is a transformers checkpoint directory (``pretrained`` in the model config,
verified by :mod:`mortred_twisted.models.classification.pretrained`), loaded with
``AutoModelForObjectDetection`` and ``AutoImageProcessor`` from local files only. The
shipped ``RTDETR`` catalog entry is a small RT-DETR trained here on the generated shape
scenes (``weights/perception/rtdetr``).

Input: PNG/JPEG images of any size, decoded to RGB and preprocessed by the checkpoint's
image processor (its ``preprocessor_config.json``; padding masks are passed on when the
processor makes them). Postprocessing:

1. the processor's own ``post_process_object_detection`` (sigmoid or softmax scores as
   the architecture defines them) keeps scores ``>= model_score_threshold`` and maps the
   boxes to the input picture's pixels;
2. class-agnostic greedy NMS at IoU ``model_nms_threshold`` (torch, no torchvision);
3. the ``model_keep_top_k`` highest scores; boxes clipped to the picture.

Output: the schema of YOLOV8 — per image a list of ``{"class_id", "score",
"category", "bbox": [x1, y1, x2, y2]}`` sorted by decreasing score, ``category`` from
the config's ``id2label``; several images give ``{"results": [list, ...]}``. ``params``
may override the three thresholds per request.

Declared with the SDK (:class:`ObjectDetectionModel`, the seed's ``"mortred-v1"``
contract, the params of YOLOV8); ``predict_batch`` runs one forward pass over all
requests' pictures and isolates per-request failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InputDecodeError, Model, ModelLoadError
from mortred_twisted.models.classification.pretrained import (
    load_processor,
    quiet_transformers,
    verified_directory,
)
from mortred_twisted.models.classification.weights import resolve_device
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.detection.ops import nms
from mortred_twisted.models.detection.yolov8 import (
    IMAGES,
    KEEP_TOP_K,
    NMS_THRESHOLD,
    SCORE_THRESHOLD,
    detection_records,
    settings_of,
    threshold_options,
)
from mortred_twisted.models.schemas import DETECTION_OUTPUT
from mortred_twisted.models.transformers_tasks.common import label_names as class_names
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
    """Detects objects with a transformers detector (RT-DETR, DETR, YOLOS, …)."""

    contract = "mortred-v1"
    output_schema = DETECTION_OUTPUT

    net: torch.nn.Module
    processor: Any
    class_names: list[str]
    device: torch.device
    defaults: dict[str, Any]

    def setup(self) -> None:
        """Load the verified ``pretrained`` directory (network and processor shared by
        the workers of one process, read-only). Options: ``pretrained`` (relative to
        the root), ``device``, ``model_score_threshold`` (0.25),
        ``model_nms_threshold`` (0.45), ``model_keep_top_k`` (100). Raises
        :class:`ModelLoadError`."""
        options = self.options
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: {list(OPTIONS)}"
            )
        self.defaults = threshold_options(options)
        directory = verified_directory(options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        self.device = resolve_device(options.get("device", "cpu"))
        self.net, self.processor, names = load(directory, self.device)
        self.class_names = list(names)

    @staticmethod
    def pictures(images: Sequence[Image]) -> list[PILImage.Image]:
        """A request's images decoded to RGB (InputDecodeError for none or a bad one)."""
        if not images:
            raise InputDecodeError("no image in request")
        return [PILImage.fromarray(decode_image(image.read())) for image in images]

    @torch.inference_mode()
    def detect(
        self,
        pictures: Sequence[PILImage.Image],
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> list[Detections]:
        """Per picture ``(boxes (K, 4) xyxy in its pixels, scores (K,), class_ids (K,))``,
        highest score first, after the three postprocessing steps."""
        return self.postprocess(
            self.forward(pictures),
            [(p.height, p.width) for p in pictures],
            score_threshold,
            nms_threshold,
            keep_top_k,
        )

    @torch.inference_mode()
    def forward(self, pictures: Sequence[PILImage.Image]) -> Any:
        """The network's raw outputs for RGB pictures (one forward pass)."""
        inputs = self.processor(images=list(pictures), return_tensors="pt")
        kwargs = {"pixel_values": inputs["pixel_values"].to(self.device)}
        if "pixel_mask" in inputs:
            kwargs["pixel_mask"] = inputs["pixel_mask"].to(self.device)
        return self.net(**kwargs)

    def postprocess(
        self,
        outputs: Any,
        sizes: Sequence[tuple[int, int]],
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> list[Detections]:
        """Raw outputs of ``len(sizes)`` pictures (``(height, width)`` each) -> detections."""
        outputs.logits = outputs.logits.float().cpu()
        outputs.pred_boxes = outputs.pred_boxes.float().cpu()
        results = self.processor.post_process_object_detection(
            outputs, threshold=score_threshold, target_sizes=list(sizes)
        )
        out: list[Detections] = []
        for result, (height, width) in zip(results, sizes, strict=True):
            boxes, scores = result["boxes"].float(), result["scores"].float()
            labels = result["labels"].long()
            order = scores.argsort(descending=True, stable=True)
            boxes, scores, labels = boxes[order], scores[order], labels[order]
            kept = nms(boxes, scores, nms_threshold)[:keep_top_k]
            boxes = boxes[kept].clone()
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
            out.append((boxes, scores[kept], labels[kept]))
        return out

    def _data(self, outputs: Any, pictures: list[PILImage.Image], given: Mapping[str, Any]) -> Any:
        sizes = [(p.height, p.width) for p in pictures]
        settings = settings_of(self.defaults, given)
        items = [
            detection_records(*d, self.class_names)
            for d in self.postprocess(outputs, sizes, *settings)
        ]
        return items[0] if len(items) == 1 else {"results": items}

    def predict(
        self,
        ctx: Context,
        images: list[Image] = IMAGES,
        model_score_threshold: float = SCORE_THRESHOLD,
        model_nms_threshold: float = NMS_THRESHOLD,
        model_keep_top_k: int = KEEP_TOP_K,
    ) -> Any:
        """Detect objects in the request's images (one forward pass)."""
        ctx.check_cancelled()
        pictures = self.pictures(images)
        outputs = self.forward(pictures)
        ctx.progress(1, 1)
        given = {
            "model_score_threshold": model_score_threshold,
            "model_nms_threshold": model_nms_threshold,
            "model_keep_top_k": model_keep_top_k,
        }
        return self._data(outputs, pictures, given)

    def predict_batch(self, ctx: Context, items: list[dict[str, Any]]) -> list[Any]:
        """Decode each request alone; one forward pass over all the good pictures."""
        prepared: list[list[PILImage.Image] | BaseException] = []
        for item in items:
            try:
                prepared.append(self.pictures(item["images"]))
            except Exception as exc:
                prepared.append(exc)
        good = [pic for p in prepared if isinstance(p, list) for pic in p]
        if not good:
            return list(prepared)
        try:
            outputs = self.forward(good)
        except Exception as exc:
            return [p if isinstance(p, BaseException) else exc for p in prepared]
        out: list[Any] = []
        offset = 0
        for item, part in zip(items, prepared, strict=True):
            if isinstance(part, BaseException):
                out.append(part)
                continue
            n = len(part)
            try:
                out.append(self._data(_slice_outputs(outputs, offset, offset + n), part, item))
            except Exception as exc:
                out.append(exc)
            offset += n
        ctx.progress(1, 1)
        return out


class _Outputs:
    """The two fields of a detector's output that post-processing reads."""

    def __init__(self, logits: torch.Tensor, pred_boxes: torch.Tensor) -> None:
        self.logits = logits
        self.pred_boxes = pred_boxes


def _slice_outputs(outputs: Any, start: int, stop: int) -> _Outputs:
    return _Outputs(outputs.logits[start:stop], outputs.pred_boxes[start:stop])


_SHARED: dict[tuple[str, str], tuple[torch.nn.Module, Any, list[str]]] = {}


def load(directory: Path, device: torch.device) -> tuple[torch.nn.Module, Any, list[str]]:
    """Network (eval mode, on ``device``), processor and class names of a verified
    directory; workers of one process share them."""
    key = (str(directory), str(device))
    if key not in _SHARED:
        from transformers import AutoModelForObjectDetection

        quiet_transformers()
        try:
            net = AutoModelForObjectDetection.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot load object detector from {directory}: {exc}") from exc
        _SHARED[key] = (net.eval().to(device), load_processor(directory), class_names(net.config))
    return _SHARED[key]


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One detector set up and served through the SDK (no input limits: the registry's
    ``create_model`` sets the configured ones; the instance is the returned model's
    ``.instance``). Raises :class:`ModelLoadError`."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(ObjectDetectionModel, options, root)
