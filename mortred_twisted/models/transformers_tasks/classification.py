"""``task = "image-classification"``: any ``AutoModelForImageClassification`` directory
(ViT, ResNet, MobileNetV2, ConvNeXt, …).

Inputs: ``image`` (a picture, any size; decoded to RGB and preprocessed by the
directory's image processor), ``top_k`` (how many classes to return, 1..1000, capped
at the number of classes; default 5). Output: ``{"labels": [str], "scores": [float],
"class_ids": [int]}``, highest softmax probability first. Sync requests are batched:
one forward pass per preprocessed shape, each item failing alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mortred_twisted.models.transformers_tasks.common import (
    COMMON_OPTIONS,
    bounded,
    check_options,
    forward_groups,
    label_names,
    load_parts,
    run_items,
)
from mortred_twisted.sdk import Context, Image, Input, ServedModel


@dataclass
class Classification:
    """The ``top_k`` most probable classes, most probable first."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]


class ImageClassifier(ServedModel):
    """Classifies a picture with a transformers image classifier."""

    max_batch_size = 16

    def setup(self) -> None:
        check_options(self.options, COMMON_OPTIONS)
        self.parts = load_parts(self.options, self.root, "AutoModelForImageClassification")
        self.labels = label_names(self.parts.config)

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture (PNG, JPEG, WebP, …)"),
        top_k: int = Input(5, ge=1, le=1000, description="classes returned (capped at N)"),
    ) -> Classification:
        out = self.predict_batch(ctx, [{"image": image, "top_k": top_k}])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        return run_items(items, self._classify)

    def probabilities(self, pictures: list[Any]) -> list[Any]:
        """Softmax probabilities (float32 CPU tensor of N classes, class order) of each
        RGB picture (PIL), in picture order: one forward pass per preprocessed shape.
        The ``mortred-v1`` contract formats these too (:mod:`..mortred_v1`)."""
        model = self.parts.model
        placed = forward_groups(
            self.parts, pictures, lambda batch: model(**batch).logits.float().softmax(-1).cpu()
        )
        return [out[row] for out, row in placed]

    def _classify(self, pictures: list[Any], items: list[dict[str, Any]]) -> list[Any]:
        answers: list[Any] = []
        for probs, item in zip(self.probabilities(pictures), items, strict=True):
            k = bounded("top_k", item.get("top_k"), len(self.labels))
            scores, ids = probs.topk(k)
            answers.append(
                Classification(
                    labels=[self.labels[i] for i in ids.tolist()],
                    scores=[round(float(s), 6) for s in scores],
                    class_ids=[int(i) for i in ids],
                )
            )
        return answers
