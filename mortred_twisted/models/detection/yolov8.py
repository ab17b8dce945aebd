"""YOLOV8: shape detection served by our small anchor-free YOLOv8-style network.

Input: PNG/JPEG images of any size (RGB). Each picture is letterboxed: scaled by
``input_size / max(width, height)``, pasted at the top-left of a grey (114) square of
``input_size`` px. Postprocessing (as the C++ config names it):

1. per anchor, the best class and its sigmoid score;
2. keep scores ``>= model_score_threshold``;
3. class-agnostic greedy NMS at IoU ``model_nms_threshold``;
4. keep the ``model_keep_top_k`` highest scores;
5. boxes mapped back to the input picture's pixels and clipped to it.

Output ``data`` for one image: a list of ``{"class_id", "score", "category",
"bbox": [x1, y1, x2, y2]}`` sorted by decreasing score; several images give
``{"results": [list, ...]}``. ``params`` may override the three thresholds per
request. ``run_batch`` runs one forward pass over all requests' pictures and isolates
per-request failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mortred_twisted.models.base import (
    InferenceRequest,
    InputDecodeError,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.models.classification.weights import (
    load_state,
    load_verified_checkpoint,
    option,
    read_class_names,
    resolve_device,
    resolve_path,
)
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.detection.network import YoloV8, decode
from mortred_twisted.models.detection.ops import nms
from mortred_twisted.models.params import ParamSpec
from mortred_twisted.models.schemas import DETECTION_OUTPUT

MODEL_TYPE = "YOLOV8"
DEFAULT_WEIGHTS = "weights/perception/yolov8_shapes.pt"
DEFAULT_CLASS_NAMES = "conf/model/object_detection/shapes_class_names.txt"
PAD_VALUE = 114


def letterbox(rgb: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """Scale ``rgb`` to fit ``size`` px (aspect kept), pad bottom/right; return scale."""
    h, w = rgb.shape[:2]
    if h == 0 or w == 0:
        raise InputDecodeError("empty image")
    scale = size / max(h, w)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    out = np.full((size, size, 3), PAD_VALUE, dtype=np.uint8)
    if (nw, nh) != (w, h):
        rgb = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))
    out[:nh, :nw] = rgb
    return out, scale


def to_tensor(batch: np.ndarray) -> torch.Tensor:
    """``(N, S, S, 3)`` uint8 -> ``(N, 3, S, S)`` float in ``[0, 1]``."""
    return torch.from_numpy(batch).permute(0, 3, 1, 2).float().div_(255.0)


def postprocess(
    boxes: torch.Tensor,
    probs: torch.Tensor,
    score_threshold: float,
    nms_threshold: float,
    keep_top_k: int,
    pre_nms_top_k: int = 1000,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One picture's ``(A, 4)`` boxes and ``(A, C)`` probabilities -> kept
    ``(boxes, scores, class_ids)``, highest score first."""
    scores, class_ids = probs.max(-1)
    keep = scores >= score_threshold
    boxes, scores, class_ids = boxes[keep], scores[keep], class_ids[keep]
    if scores.numel() > pre_nms_top_k:
        top = scores.topk(pre_nms_top_k).indices
        boxes, scores, class_ids = boxes[top], scores[top], class_ids[top]
    kept = nms(boxes, scores, nms_threshold)[:keep_top_k]
    return boxes[kept], scores[kept], class_ids[kept]


class YoloV8Model(Model):
    """One worker's detector instance (the network may be shared, read-only)."""

    output_schema = DETECTION_OUTPUT

    params_schema: Sequence[ParamSpec] = (
        ParamSpec(
            "model_score_threshold",
            float,
            minimum=0.0,
            maximum=1.0,
            description="minimum class score (default from the config)",
        ),
        ParamSpec(
            "model_nms_threshold",
            float,
            minimum=0.0,
            maximum=1.0,
            description="IoU above which a lower-scoring box is suppressed",
        ),
        ParamSpec(
            "model_keep_top_k",
            int,
            minimum=1,
            maximum=10000,
            description="maximum detections returned per image",
        ),
    )

    def __init__(
        self,
        net: YoloV8,
        class_names: Sequence[str],
        device: torch.device,
        score_threshold: float,
        nms_threshold: float,
        keep_top_k: int,
    ) -> None:
        self.net = net
        self.class_names = list(class_names)
        self.device = device
        self.defaults = {
            "model_score_threshold": score_threshold,
            "model_nms_threshold": nms_threshold,
            "model_keep_top_k": keep_top_k,
        }

    def _prepare(
        self, request: InferenceRequest
    ) -> tuple[np.ndarray, list[tuple[int, int, float]]]:
        if not request.images:
            raise InputDecodeError("no image in request")
        pics, metas = [], []
        for data in request.images:
            rgb = decode_image(data)
            pic, scale = letterbox(rgb, self.net.input_size)
            pics.append(pic)
            metas.append((rgb.shape[1], rgb.shape[0], scale))
        return np.stack(pics), metas

    @torch.inference_mode()
    def predict(self, batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded ``(N, A, 4)`` boxes (network pixels) and ``(N, A, C)`` probabilities."""
        boxes, probs = decode(self.net, self.net(to_tensor(batch).to(self.device)))
        return boxes.float().cpu(), probs.float().cpu()

    def _detections(
        self,
        boxes: torch.Tensor,
        probs: torch.Tensor,
        meta: tuple[int, int, float],
        params: Mapping[str, Any],
    ) -> list[dict[str, Any]]:
        cfg = {**self.defaults, **{k: v for k, v in params.items() if v is not None}}
        kb, ks, kc = postprocess(
            boxes,
            probs,
            cfg["model_score_threshold"],
            cfg["model_nms_threshold"],
            cfg["model_keep_top_k"],
        )
        width, height, scale = meta
        kb = kb / scale
        kb[:, 0::2] = kb[:, 0::2].clamp(0, width)
        kb[:, 1::2] = kb[:, 1::2].clamp(0, height)
        return [
            {
                "class_id": int(c),
                "score": round(float(s), 6),
                "category": self.class_names[int(c)],
                "bbox": [round(float(v), 2) for v in b],
            }
            for b, s, c in zip(kb, ks, kc, strict=True)
        ]

    def _data(
        self,
        request: InferenceRequest,
        boxes: torch.Tensor,
        probs: torch.Tensor,
        metas: list[tuple[int, int, float]],
    ) -> Any:
        items = [
            self._detections(boxes[i], probs[i], meta, request.params)
            for i, meta in enumerate(metas)
        ]
        return items[0] if len(items) == 1 else {"results": items}

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        """Detect shapes in the request's images (one forward pass)."""
        ctx.check_cancelled()
        batch, metas = self._prepare(request)
        boxes, probs = self.predict(batch)
        ctx.progress(1, 1)
        return self._data(request, boxes, probs, metas)

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        """Decode each request alone; one forward pass over all the good pictures."""
        prepared: list[Any] = []
        for request in requests:
            try:
                prepared.append(self._prepare(request))
            except Exception as exc:
                prepared.append(exc)
        good = [p[0] for p in prepared if not isinstance(p, BaseException)]
        if not good:
            return prepared
        try:
            boxes, probs = self.predict(np.concatenate(good))
        except Exception as exc:
            return [p if isinstance(p, BaseException) else exc for p in prepared]
        out: list[Any | BaseException] = []
        offset = 0
        for request, ctx, item in zip(requests, ctxs, prepared, strict=True):
            if isinstance(item, BaseException):
                out.append(item)
                continue
            n = item[0].shape[0]
            try:
                out.append(
                    self._data(
                        request, boxes[offset : offset + n], probs[offset : offset + n], item[1]
                    )
                )
            except Exception as exc:
                out.append(exc)
            offset += n
            ctx.progress(1, 1)
        return out


def build_network(arch: Mapping[str, Any]) -> YoloV8:
    """The network described by a checkpoint's ``arch`` keywords."""
    try:
        return YoloV8(**dict(arch))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"bad YOLOv8 architecture in weights: {exc}") from exc


_SHARED: dict[tuple[str, str], tuple[YoloV8, list[str]]] = {}


def create(options: Mapping[str, Any], root: Path) -> YoloV8Model:
    """Load verified weights and class names; thresholds from the C++ config keys.

    Options: ``model_weights_path``, ``model_class_names_path``, ``device``,
    ``model_score_threshold`` (0.25), ``model_nms_threshold`` (0.45),
    ``model_keep_top_k`` (100).
    """
    weights = resolve_path(
        root, option(options, "model_weights_path", DEFAULT_WEIGHTS, str), "model_weights_path"
    )
    names_path = resolve_path(
        root,
        option(options, "model_class_names_path", DEFAULT_CLASS_NAMES, str),
        "model_class_names_path",
    )
    device = resolve_device(options.get("device", "cpu"))
    score = option(options, "model_score_threshold", 0.25, float)
    nms_t = option(options, "model_nms_threshold", 0.45, float)
    top_k = option(options, "model_keep_top_k", 100, int)
    if not (0.0 <= score <= 1.0 and 0.0 <= nms_t <= 1.0 and top_k >= 1):
        raise ModelLoadError("thresholds must lie in [0, 1] and model_keep_top_k >= 1")
    key = (str(weights), str(device))
    if key not in _SHARED:
        checkpoint = load_verified_checkpoint(weights, MODEL_TYPE)
        net = build_network(checkpoint["arch"])
        load_state(net, checkpoint, weights)
        _SHARED[key] = (net.to(device), read_class_names(names_path, net.num_classes))
    net, names = _SHARED[key]
    return YoloV8Model(net, names, device, score, nms_t, top_k)
