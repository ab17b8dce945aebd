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
request (absent: the model config's value).

Declared with the SDK (:class:`YoloV8Model`, the seed's ``"mortred-v1"`` contract:
the params, 422 messages and ``data`` of the seed); ``predict_batch`` runs one
forward pass over all requests' pictures and isolates per-request failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InputDecodeError, Model, ModelLoadError
from mortred_twisted.models.box_ops import nms
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.schemas import DETECTION_OUTPUT
from mortred_twisted.models.weights import (
    load_state,
    load_verified_checkpoint,
    option,
    read_class_names,
    resolve_device,
    resolve_path,
)
from mortred_twisted.models.yolov8.network import YoloV8, decode
from mortred_twisted.sdk import Context, Image, Input, ServedModel

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
        rgb = np.asarray(PILImage.fromarray(rgb).resize((nw, nh), PILImage.BILINEAR))
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


# The detectors' params (YOLOV8 and OBJECT_DETECTION declare the same three): absent
# unless given, the model config's threshold then applies.
IMAGES = Input(description="PNG/JPEG pictures, any size")
SCORE_THRESHOLD = Input(
    None, ge=0.0, le=1.0, description="minimum class score (default from the config)"
)
NMS_THRESHOLD = Input(
    None, ge=0.0, le=1.0, description="IoU above which a lower-scoring box is suppressed"
)
KEEP_TOP_K = Input(None, ge=1, le=10000, description="maximum detections returned per image")
SETTINGS = ("model_score_threshold", "model_nms_threshold", "model_keep_top_k")


def threshold_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The three thresholds' config values (C++ key names; 0.25, 0.45, 100 when
    absent), checked; raises ModelLoadError."""
    score = option(options, "model_score_threshold", 0.25, float)
    nms_t = option(options, "model_nms_threshold", 0.45, float)
    top_k = option(options, "model_keep_top_k", 100, int)
    if not (0.0 <= score <= 1.0 and 0.0 <= nms_t <= 1.0 and top_k >= 1):
        raise ModelLoadError("thresholds must lie in [0, 1] and model_keep_top_k >= 1")
    return dict(zip(SETTINGS, (score, nms_t, top_k), strict=True))


def settings_of(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[Any, ...]:
    """(score, nms, top_k) for one request: the given params over the config's."""
    cfg = {**defaults, **{k: v for k, v in given.items() if k in SETTINGS and v is not None}}
    return tuple(cfg[k] for k in SETTINGS)


def detection_records(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, names: Sequence[str]
) -> list[dict[str, Any]]:
    """One picture's kept detections as the envelope's records (rounded as the seed)."""
    return [
        {
            "class_id": int(c),
            "score": round(float(s), 6),
            "category": names[int(c)],
            "bbox": [round(float(v), 2) for v in b],
        }
        for b, s, c in zip(boxes, scores, labels, strict=True)
    ]


Prepared = tuple[np.ndarray, list[tuple[int, int, float]]]


class YoloV8Model(ServedModel):
    """Detects shapes (circle, rectangle, triangle) with a small YOLOv8-style network."""

    contract = "mortred-v1"
    output_schema = DETECTION_OUTPUT

    net: YoloV8
    class_names: list[str]
    device: torch.device
    defaults: dict[str, Any]

    def setup(self) -> None:
        """Load verified weights and class names; thresholds from the C++ config keys.

        Options: ``model_weights_path``, ``model_class_names_path``, ``device``,
        ``model_score_threshold`` (0.25), ``model_nms_threshold`` (0.45),
        ``model_keep_top_k`` (100). Workers of one process share the network.
        Raises :class:`ModelLoadError`.
        """
        options, root = self.options, self.root
        weights = resolve_path(
            root, option(options, "model_weights_path", DEFAULT_WEIGHTS, str), "model_weights_path"
        )
        names_path = resolve_path(
            root,
            option(options, "model_class_names_path", DEFAULT_CLASS_NAMES, str),
            "model_class_names_path",
        )
        self.device = resolve_device(options.get("device", "cpu"))
        self.defaults = threshold_options(options)
        key = (str(weights), str(self.device))
        if key not in _SHARED:
            checkpoint = load_verified_checkpoint(weights, MODEL_TYPE)
            net = build_network(checkpoint["arch"])
            load_state(net, checkpoint, weights)
            _SHARED[key] = (net.to(self.device), read_class_names(names_path, net.num_classes))
        self.net, names = _SHARED[key]
        self.class_names = list(names)

    def prepare(self, images: Sequence[Image]) -> Prepared:
        """Letterboxed pictures ``(N, S, S, 3)`` and per picture (width, height, scale)."""
        if not images:
            raise InputDecodeError("no image in request")
        pics, metas = [], []
        for image in images:
            rgb = decode_image(image.read())
            pic, scale = letterbox(rgb, self.net.input_size)
            pics.append(pic)
            metas.append((rgb.shape[1], rgb.shape[0], scale))
        return np.stack(pics), metas

    @torch.inference_mode()
    def forward(self, batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded ``(N, A, 4)`` boxes (network pixels) and ``(N, A, C)`` probabilities."""
        boxes, probs = decode(self.net, self.net(to_tensor(batch).to(self.device)))
        return boxes.float().cpu(), probs.float().cpu()

    def _detections(
        self,
        boxes: torch.Tensor,
        probs: torch.Tensor,
        meta: tuple[int, int, float],
        settings: tuple[Any, ...],
    ) -> list[dict[str, Any]]:
        kb, ks, kc = postprocess(boxes, probs, *settings)
        width, height, scale = meta
        kb = kb / scale
        kb[:, 0::2] = kb[:, 0::2].clamp(0, width)
        kb[:, 1::2] = kb[:, 1::2].clamp(0, height)
        return detection_records(kb, ks, kc, self.class_names)

    def _data(
        self,
        boxes: torch.Tensor,
        probs: torch.Tensor,
        metas: list[tuple[int, int, float]],
        given: Mapping[str, Any],
    ) -> Any:
        settings = settings_of(self.defaults, given)
        items = [
            self._detections(boxes[i], probs[i], meta, settings) for i, meta in enumerate(metas)
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
        """Detect shapes in the request's images (one forward pass)."""
        ctx.check_cancelled()
        batch, metas = self.prepare(images)
        boxes, probs = self.forward(batch)
        ctx.progress(1, 1)
        given = {
            "model_score_threshold": model_score_threshold,
            "model_nms_threshold": model_nms_threshold,
            "model_keep_top_k": model_keep_top_k,
        }
        return self._data(boxes, probs, metas, given)

    def predict_batch(self, ctx: Context, items: list[dict[str, Any]]) -> list[Any]:
        """Decode each request alone; one forward pass over all the good pictures."""
        prepared: list[Prepared | BaseException] = []
        for item in items:
            try:
                prepared.append(self.prepare(item["images"]))
            except Exception as exc:
                prepared.append(exc)
        good = [p[0] for p in prepared if not isinstance(p, BaseException)]
        if not good:
            return list(prepared)
        try:
            boxes, probs = self.forward(np.concatenate(good))
        except Exception as exc:
            return [p if isinstance(p, BaseException) else exc for p in prepared]
        out: list[Any] = []
        offset = 0
        for item, part in zip(items, prepared, strict=True):
            if isinstance(part, BaseException):
                out.append(part)
                continue
            n = part[0].shape[0]
            try:
                window = slice(offset, offset + n)
                out.append(self._data(boxes[window], probs[window], part[1], item))
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


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One detector set up and served through the SDK (no input limits: the registry's
    ``create_model`` sets the configured ones; the instance is the returned model's
    ``.instance``). Raises :class:`ModelLoadError`."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(YoloV8Model, options, root)
