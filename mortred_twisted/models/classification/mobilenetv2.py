"""MOBILENETV2: digit classification served by our own MobileNetV2.

Input: each request carries one or more images (PNG/JPEG, any size, colour or grey).
Each picture is converted to grey, flipped to bright-ink-on-dark if its border is
bright (so black-on-white digits work too), resized to the network's input size and
standardised per picture (zero mean, unit variance). Output ``data`` for a request
with one image is ``{"class_id": int, "category": str, "scores": [float, ...]}``
(softmax probabilities in class order, categories from the class-name file); with
several images it is ``{"results": [that object, ...]}`` in image order.

Dynamic batching: :meth:`MobileNetV2Model.run_batch` decodes every request's images,
runs *one* forward pass over all the good ones and returns, per request, its result
or the exception that request alone raised (an undecodable image fails its request,
never its batch mates).
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
from mortred_twisted.models.classification.network import MobileNetV2
from mortred_twisted.models.classification.weights import (
    load_state,
    load_verified_checkpoint,
    option,
    read_class_names,
    resolve_device,
    resolve_path,
)
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.params import ParamSpec
from mortred_twisted.models.schemas import CLASSIFICATION_OUTPUT

MODEL_TYPE = "MOBILENETV2"
DEFAULT_WEIGHTS = "weights/perception/mobilenetv2_digits.pt"
DEFAULT_CLASS_NAMES = "conf/model/classification/digits_class_names.txt"


def grey_from_rgb(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma of a ``(H, W, 3)`` uint8 picture, ``float32`` in ``[0, 1]``."""
    return (rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)) / 255.0


def preprocess_grey(grey: np.ndarray, input_size: int) -> np.ndarray:
    """Serving-time preprocessing of a ``[0, 1]`` grey picture to ``(S, S)`` float32.

    Bright border -> inverted; bilinear resize to ``input_size``; per-picture
    standardisation (:func:`standardise`). Training applies the same standardisation.
    """
    if grey.size == 0:
        raise InputDecodeError("empty image")
    border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    if float(border.mean()) > 0.5:
        grey = 1.0 - grey
    if grey.shape != (input_size, input_size):
        pil = Image.fromarray(grey.astype(np.float32), mode="F")
        grey = np.asarray(pil.resize((input_size, input_size), Image.BILINEAR), np.float32)
    return standardise(grey)


def standardise(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance over the last two axes (contrast invariance)."""
    mean = x.mean(axis=(-2, -1), keepdims=True)
    std = x.std(axis=(-2, -1), keepdims=True)
    return ((x - mean) / (std + 1e-3)).astype(np.float32)


class MobileNetV2Model(Model):
    """One worker's classifier instance (the network may be shared, read-only)."""

    output_schema = CLASSIFICATION_OUTPUT

    params_schema: Sequence[ParamSpec] = (
        ParamSpec(
            "top_k",
            int,
            default=None,
            minimum=1,
            maximum=1000,
            description="if set, also return the top_k classes as 'top_k'",
        ),
    )

    def __init__(self, net: MobileNetV2, class_names: Sequence[str], device: torch.device) -> None:
        self.net = net
        self.class_names = list(class_names)
        self.device = device
        self.input_size = net.input_size

    def _tensor(self, request: InferenceRequest) -> np.ndarray:
        if not request.images:
            raise InputDecodeError("no image in request")
        return np.stack(
            [
                preprocess_grey(grey_from_rgb(decode_image(img)), self.input_size)
                for img in request.images
            ]
        )

    @torch.inference_mode()
    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        """Softmax scores ``(N, C)`` of preprocessed pictures ``(N, S, S)``."""
        x = torch.from_numpy(batch).unsqueeze(1).to(self.device)
        return torch.softmax(self.net(x).float(), dim=1).cpu().numpy()

    def _format(self, scores: np.ndarray, params: Mapping[str, Any]) -> dict[str, Any]:
        class_id = int(np.argmax(scores))
        out: dict[str, Any] = {
            "class_id": class_id,
            "category": self.class_names[class_id],
            "scores": [round(float(s), 6) for s in scores],
        }
        top_k = params.get("top_k")
        if top_k:
            order = np.argsort(-scores, kind="stable")[:top_k]
            out["top_k"] = [
                {"class_id": int(i), "category": self.class_names[i], "score": float(scores[i])}
                for i in order
            ]
        return out

    def _data(self, request: InferenceRequest, scores: np.ndarray) -> dict[str, Any]:
        items = [self._format(s, request.params) for s in scores]
        return items[0] if len(items) == 1 else {"results": items}

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        """Classify the request's images (one forward pass)."""
        ctx.check_cancelled()
        scores = self.probabilities(self._tensor(request))
        ctx.progress(1, 1)
        return self._data(request, scores)

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        """Decode each request alone, classify all good pictures in one forward pass."""
        prepared: list[np.ndarray | BaseException] = []
        for request in requests:
            try:
                prepared.append(self._tensor(request))
            except Exception as exc:
                prepared.append(exc)
        good = [p for p in prepared if isinstance(p, np.ndarray)]
        out: list[Any | BaseException] = []
        if not good:
            return list(prepared)  # type: ignore[arg-type]
        try:
            scores = self.probabilities(np.concatenate(good))
        except Exception as exc:
            return [exc if isinstance(p, np.ndarray) else p for p in prepared]
        offset = 0
        for request, ctx, item in zip(requests, ctxs, prepared, strict=True):
            if isinstance(item, BaseException):
                out.append(item)
                continue
            n = item.shape[0]
            out.append(self._data(request, scores[offset : offset + n]))
            offset += n
            ctx.progress(1, 1)
        return out


def build_network(arch: Mapping[str, Any]) -> MobileNetV2:
    """The network described by a checkpoint's ``arch`` keywords."""
    try:
        return MobileNetV2(**dict(arch))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"bad MobileNetV2 architecture in weights: {exc}") from exc


_SHARED: dict[tuple[str, str], tuple[MobileNetV2, list[str]]] = {}


def create(options: Mapping[str, Any], root: Path) -> MobileNetV2Model:
    """Load verified weights and the class-name file; see the module docstring.

    Options: ``model_weights_path`` (relative to ``root``), ``model_class_names_path``,
    ``device``, optional ``input_size`` (must match the weights). Workers of one
    process share the read-only network.
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
    key = (str(weights), str(device))
    if key not in _SHARED:
        checkpoint = load_verified_checkpoint(weights, MODEL_TYPE)
        net = build_network(checkpoint["arch"])
        load_state(net, checkpoint, weights)
        num_classes = net.classifier[-1].out_features
        names = read_class_names(names_path, num_classes)
        _SHARED[key] = (net.to(device), names)
    net, names = _SHARED[key]
    wanted = options.get("input_size")
    if wanted is not None and wanted != net.input_size:
        raise ModelLoadError(
            f"input_size {wanted} in the config does not match the weights ({net.input_size})"
        )
    return MobileNetV2Model(net, names, device)
