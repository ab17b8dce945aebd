"""MOBILENETV2: the catalog id of the shipped digit classifier, an alias of
IMAGE_CLASSIFICATION (:mod:`.image_classification`): a transformers
``MobileNetV2ForImageClassification`` trained here, served from
``weights/perception/mobilenetv2``. Kept so that the model type ``MOBILENETV2`` and
imports of this module keep working."""

from __future__ import annotations

from mortred_twisted.models.classification.image_classification import (
    ImageClassificationModel,
    create,
)

MobileNetV2Model = ImageClassificationModel

__all__ = ["MobileNetV2Model", "create"]
