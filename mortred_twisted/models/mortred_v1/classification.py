"""Image classification with the seed's contract (``MOBILENETV2``,
``IMAGE_CLASSIFICATION``): an adapter over the task model
:class:`~mortred_twisted.models.transformers_tasks.classification.ImageClassifier`.

The directory (``pretrained``, default the shipped digit classifier) must match its
``manifest.json`` (:mod:`mortred_twisted.models.pretrained`), as
for every shipped entry; the task model loads it and computes the softmax scores.
The adapter maps:

* the envelope's ``images`` (PNG/JPEG, any size) onto the task's pictures, several
  per request in one forward pass with every request batched beside it;
* ``params.top_k`` (optional, 1..1000) onto the legacy ``top_k`` list;
* the scores onto ``data`` ``{"class_id", "category", "scores": [every class, class
  order]}`` (+ ``"top_k": [{"class_id", "category", "score"}]`` when asked), each
  score rounded to 6 places; several images: ``{"results": [...]}`` in image order.

A request batched with others gets the same class ids and the same scores up to
float noise (the kernels torch picks depend on the batch size and the CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image as PILImage

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.models.mortred_v1.common import fan_out, task_instance
from mortred_twisted.models.pretrained import verified_directory
from mortred_twisted.models.schemas import CLASSIFICATION_OUTPUT
from mortred_twisted.models.transformers_tasks.classification import ImageClassifier
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MODEL_TYPE = "IMAGE_CLASSIFICATION"
DEFAULT_PRETRAINED = "weights/perception/mobilenetv2"
OPTIONS = ("pretrained", "device")


class ImageClassificationModel(ServedModel):
    """The seed's classifier: softmax scores of every class, the top class and its
    label, optionally the top_k classes."""

    contract = "mortred-v1"
    output_schema = CLASSIFICATION_OUTPUT

    task: ImageClassifier
    class_names: list[str]

    def setup(self) -> None:
        """Verify the directory against its manifest, then set the task model up on it
        (options ``pretrained``, ``device``). Raises :class:`ModelLoadError`."""
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: pretrained, device"
            )
        directory = verified_directory(self.options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        options = {"pretrained": str(directory), "device": self.options.get("device", "cpu")}
        self.task = task_instance(ImageClassifier, options, self.root)
        self.class_names = self.task.labels

    def probabilities(self, pictures: Sequence[PILImage.Image]) -> np.ndarray:
        """Softmax scores ``(N, C)`` of RGB pictures (the task model's)."""
        return torch.stack(self.task.probabilities(list(pictures))).numpy()

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

    def _data(self, item: Mapping[str, Any], rows: Sequence[Any]) -> dict[str, Any]:
        results = [self._format(row, item.get("top_k")) for row in rows]
        return results[0] if len(results) == 1 else {"results": results}

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
        out = self.predict_batch(ctx, [{"images": images, "top_k": top_k}])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Context, items: list[dict[str, Any]]) -> list[Any]:
        """Every request's pictures in one forward pass; each request fails alone."""
        out = fan_out(items, self.probabilities, self._data)
        ctx.progress(1, 1)
        return out


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One classifier set up and served through the SDK, without input limits (the
    registry's ``create_model`` sets the configured ones); for tests and tools."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(ImageClassificationModel, options, root)
