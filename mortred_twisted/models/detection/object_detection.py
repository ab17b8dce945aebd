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
may override the three thresholds per request. ``run_batch`` runs one forward pass
over all requests' pictures and isolates per-request failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from mortred_twisted.models.base import (
    InferenceRequest,
    InputDecodeError,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.models.classification.image_classification import class_names
from mortred_twisted.models.classification.pretrained import (
    load_processor,
    quiet_transformers,
    verified_directory,
)
from mortred_twisted.models.classification.weights import option, resolve_device
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.detection.ops import nms
from mortred_twisted.models.detection.yolov8 import YoloV8Model
from mortred_twisted.models.schemas import DETECTION_OUTPUT

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


class ObjectDetectionModel(Model):
    """One worker's detector instance (network and processor shared, read-only)."""

    output_schema = DETECTION_OUTPUT
    params_schema = YoloV8Model.params_schema

    def __init__(
        self,
        net: torch.nn.Module,
        processor: Any,
        names: Sequence[str],
        device: torch.device,
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> None:
        self.net = net
        self.processor = processor
        self.class_names = list(names)
        self.device = device
        self.defaults = {
            "model_score_threshold": score_threshold,
            "model_nms_threshold": nms_threshold,
            "model_keep_top_k": keep_top_k,
        }

    def _pictures(self, request: InferenceRequest) -> list[Image.Image]:
        if not request.images:
            raise InputDecodeError("no image in request")
        return [Image.fromarray(decode_image(img)) for img in request.images]

    @torch.inference_mode()
    def detect(
        self,
        pictures: Sequence[Image.Image],
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
    def forward(self, pictures: Sequence[Image.Image]) -> Any:
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

    def _format(self, detections: Detections) -> list[dict[str, Any]]:
        boxes, scores, labels = detections
        return [
            {
                "class_id": int(c),
                "score": round(float(s), 6),
                "category": self.class_names[int(c)],
                "bbox": [round(float(v), 2) for v in b],
            }
            for b, s, c in zip(boxes, scores, labels, strict=True)
        ]

    def _settings(self, params: Mapping[str, Any]) -> tuple[float, float, int]:
        cfg = {**self.defaults, **{k: v for k, v in params.items() if v is not None}}
        return (
            cfg["model_score_threshold"],
            cfg["model_nms_threshold"],
            cfg["model_keep_top_k"],
        )

    def _data(self, request: InferenceRequest, outputs: Any, sizes: list[tuple[int, int]]) -> Any:
        items = [
            self._format(d)
            for d in self.postprocess(outputs, sizes, *self._settings(request.params))
        ]
        return items[0] if len(items) == 1 else {"results": items}

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        """Detect objects in the request's images (one forward pass)."""
        ctx.check_cancelled()
        pictures = self._pictures(request)
        outputs = self.forward(pictures)
        ctx.progress(1, 1)
        return self._data(request, outputs, [(p.height, p.width) for p in pictures])

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        """Decode each request alone; one forward pass over all the good pictures."""
        prepared: list[list[Image.Image] | BaseException] = []
        for request in requests:
            try:
                prepared.append(self._pictures(request))
            except Exception as exc:
                prepared.append(exc)
        good = [pic for p in prepared if isinstance(p, list) for pic in p]
        if not good:
            return list(prepared)  # type: ignore[arg-type]
        try:
            outputs = self.forward(good)
        except Exception as exc:
            return [p if isinstance(p, BaseException) else exc for p in prepared]
        out: list[Any | BaseException] = []
        offset = 0
        for request, ctx, item in zip(requests, ctxs, prepared, strict=True):
            if isinstance(item, BaseException):
                out.append(item)
                continue
            n = len(item)
            try:
                part = _slice_outputs(outputs, offset, offset + n)
                out.append(self._data(request, part, [(p.height, p.width) for p in item]))
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


def create(options: Mapping[str, Any], root: Path) -> ObjectDetectionModel:
    """Build a detector from the verified ``pretrained`` directory; see the module doc.

    Options: ``pretrained`` (directory, relative to ``root``), ``device``,
    ``model_score_threshold`` (0.25), ``model_nms_threshold`` (0.45),
    ``model_keep_top_k`` (100). Raises :class:`ModelLoadError`.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ModelLoadError(f"unknown model option(s) {sorted(unknown)}; known: {list(OPTIONS)}")
    score = option(options, "model_score_threshold", 0.25, float)
    nms_t = option(options, "model_nms_threshold", 0.45, float)
    top_k = option(options, "model_keep_top_k", 100, int)
    if not (0.0 <= score <= 1.0 and 0.0 <= nms_t <= 1.0 and top_k >= 1):
        raise ModelLoadError("thresholds must lie in [0, 1] and model_keep_top_k >= 1")
    directory = verified_directory(options, root, DEFAULT_PRETRAINED, MODEL_TYPE)
    device = resolve_device(options.get("device", "cpu"))
    net, processor, names = load(directory, device)
    return ObjectDetectionModel(net, processor, names, device, score, nms_t, top_k)
