"""IMAGE_CLASSIFICATION: any transformers image classifier (MobileNetV2, ViT, ResNet, …).

The model is a transformers checkpoint directory (``pretrained`` in the model config,
verified by :mod:`mortred_twisted.models.classification.pretrained`), loaded with
``AutoModelForImageClassification`` and ``AutoImageProcessor`` from local files only.
``MOBILENETV2`` is the catalog id of the shipped digit classifier and is accepted as a
model type too (same class).

Input: each request carries one or more images (PNG/JPEG, any size, colour or grey),
decoded to RGB and preprocessed by the checkpoint's own image processor (its
``preprocessor_config.json``: resize, crop, rescale, normalise). Output ``data`` for a
request with one image is ``{"class_id": int, "category": str, "scores": [float, ...]}``
(softmax probabilities in class order, ``category`` from the config's ``id2label``);
with several images it is ``{"results": [that object, ...]}`` in image order. The
``top_k`` param adds ``"top_k": [{"class_id", "category", "score"}, ...]``. Every
score (``scores`` and ``top_k[].score``) is rounded to 6 places. A request batched with
others gets the same class ids and the same scores up to float noise: the kernels
torch picks depend on the batch size and the CPU, so a score may differ in its last
(6th) place between the two, never in which classes come out or their order apart
from near ties.

Declared with the SDK (:class:`ImageClassificationModel`, the seed's ``"mortred-v1"``
contract: the params, 422 messages and ``data`` of the seed). Dynamic batching:
:meth:`ImageClassificationModel.predict_batch` decodes every request's images, runs
*one* forward pass over all the good ones and returns, per request, its result or
the exception that request alone raised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
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
from mortred_twisted.models.schemas import CLASSIFICATION_OUTPUT
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MODEL_TYPE = "IMAGE_CLASSIFICATION"
DEFAULT_PRETRAINED = "weights/perception/mobilenetv2"
OPTIONS = ("pretrained", "device")


def class_names(config: Any) -> list[str]:
    """``id2label`` of a transformers config as a list indexed by class id.

    Raises :class:`ModelLoadError` when ids are not exactly ``0 … num_labels - 1``.
    """
    id2label = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    if sorted(id2label) != list(range(len(id2label))) or not id2label:
        raise ModelLoadError(f"config id2label is not 0..N-1: {sorted(id2label)[:10]}")
    return [id2label[i] for i in range(len(id2label))]


def decode_pictures(images: Sequence[Image]) -> list[PILImage.Image]:
    """A request's images as RGB pictures (worker thread); InputDecodeError for none
    or for one that does not decode."""
    if not images:
        raise InputDecodeError("no image in request")
    return [PILImage.fromarray(decode_image(image.read())) for image in images]


class ImageClassificationModel(ServedModel):
    """Classifies each picture with a transformers image classifier (softmax scores,
    the top class and its label; optionally the top_k classes)."""

    contract = "mortred-v1"
    output_schema = CLASSIFICATION_OUTPUT

    net: torch.nn.Module
    processor: Any
    class_names: list[str]
    device: torch.device

    def setup(self) -> None:
        """Load the verified ``pretrained`` directory (workers of one process share the
        network and processor, read-only). Options: ``pretrained`` (relative to the
        root; default the shipped digit classifier), ``device`` (``cpu`` or
        ``cuda[:N]``). Raises :class:`ModelLoadError`."""
        options = self.options
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: pretrained, device"
            )
        directory = verified_directory(options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        self.device = resolve_device(options.get("device", "cpu"))
        self.net, self.processor, names = load(directory, self.device)
        self.class_names = list(names)

    def pixel_values(self, pictures: Sequence[PILImage.Image]) -> torch.Tensor:
        """The processor's ``pixel_values`` ``(N, C, H, W)`` for RGB pictures."""
        return self.processor(images=list(pictures), return_tensors="pt")["pixel_values"]

    @torch.inference_mode()
    def probabilities(self, pixel_values: torch.Tensor) -> np.ndarray:
        """Softmax scores ``(N, C)`` of preprocessed pictures."""
        logits = self.net(pixel_values=pixel_values.to(self.device)).logits
        return torch.softmax(logits.float(), dim=1).cpu().numpy()

    def _format(self, scores: np.ndarray, top_k: int | None) -> dict[str, Any]:
        class_id = int(np.argmax(scores))
        out: dict[str, Any] = {
            "class_id": class_id,
            "category": self.class_names[class_id],
            "scores": [round(float(s), 6) for s in scores],
        }
        if top_k:
            order = np.argsort(-scores, kind="stable")[:top_k]
            out["top_k"] = [
                {
                    "class_id": int(i),
                    "category": self.class_names[i],
                    "score": round(float(scores[i]), 6),
                }
                for i in order
            ]
        return out

    def _data(self, scores: np.ndarray, top_k: int | None) -> dict[str, Any]:
        items = [self._format(s, top_k) for s in scores]
        return items[0] if len(items) == 1 else {"results": items}

    def predict(
        self,
        ctx: Context,
        images: list[Image] = Input(description="PNG/JPEG pictures, any size"),
        top_k: int = Input(
            None, ge=1, le=1000, description="if set, also return the top_k classes as 'top_k'"
        ),
    ) -> dict[str, Any]:
        """Classify the request's images (one forward pass)."""
        ctx.check_cancelled()
        scores = self.probabilities(self.pixel_values(decode_pictures(images)))
        ctx.progress(1, 1)
        return self._data(scores, top_k)

    def predict_batch(self, ctx: Context, items: list[dict[str, Any]]) -> list[Any]:
        """Decode each request alone, classify all good pictures in one forward pass."""
        prepared: list[torch.Tensor | BaseException] = []
        for item in items:
            try:
                prepared.append(self.pixel_values(decode_pictures(item["images"])))
            except Exception as exc:
                prepared.append(exc)
        good = [p for p in prepared if isinstance(p, torch.Tensor)]
        if not good:
            return list(prepared)
        try:
            scores = self.probabilities(torch.cat(good))
        except Exception as exc:
            return [exc if isinstance(p, torch.Tensor) else p for p in prepared]
        out: list[Any] = []
        offset = 0
        for item, part in zip(items, prepared, strict=True):
            if isinstance(part, BaseException):
                out.append(part)
                continue
            n = part.shape[0]
            out.append(self._data(scores[offset : offset + n], item.get("top_k")))
            offset += n
        ctx.progress(1, 1)
        return out


_SHARED: dict[tuple[str, str], tuple[torch.nn.Module, Any, list[str]]] = {}


def load(directory: Path, device: torch.device) -> tuple[torch.nn.Module, Any, list[str]]:
    """Network (eval mode, on ``device``), processor and class names of a directory.

    The directory must already be verified. Workers of one process share the result.
    """
    key = (str(directory), str(device))
    if key not in _SHARED:
        from transformers import AutoModelForImageClassification

        quiet_transformers()
        try:
            net = AutoModelForImageClassification.from_pretrained(
                str(directory), local_files_only=True
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot load image classifier from {directory}: {exc}") from exc
        names = class_names(net.config)
        _SHARED[key] = (net.eval().to(device), load_processor(directory), names)
    return _SHARED[key]


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One classifier set up and served through the SDK (no input limits: the
    registry's ``create_model`` sets the configured ones; the instance is the
    returned model's ``.instance``). Raises :class:`ModelLoadError`."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(ImageClassificationModel, options, root)
