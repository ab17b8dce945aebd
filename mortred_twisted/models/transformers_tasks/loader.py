"""``type = "transformers"``: a transformers checkpoint directory served by its task.

``create(options, root)`` is the registry's factory. ``options["pretrained"]`` names
the directory; ``options["task"]`` the task, or, absent, it is read from the
directory's ``config.json`` (:func:`infer_task`: the ``architectures`` it names, then
its ``model_type``). Each task is a :class:`~mortred_twisted.sdk.ServedModel` of its
own module (:data:`TASKS`), built with
:func:`~mortred_twisted.sdk.loading.build_sdk_model`: its inputs and outputs are
declared by its ``predict`` signature, and it is served like any SDK model (named
inputs, multipart forms, result files, the UI form). An unknown task, a directory
without ``config.json``, weights or image processor (or, for the zero-shot task, a
tokenizer) is a :class:`~mortred_twisted.model_api.base.ModelLoadError` naming the
missing part. ``options["contract"] = "mortred-v1"`` serves the image-classification,
object-detection and mask-generation tasks with the seed's wire contract instead
(:mod:`.contract`: the shipped catalog entries' contract, unchanged). Loader thread
only.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.models.transformers_tasks.common import directory_of, read_config

#: Task name (transformers' pipeline names) -> ``module:Class``.
TASKS: Mapping[str, str] = {
    "image-classification": "classification:ImageClassifier",
    "zero-shot-image-classification": "zero_shot:ZeroShotClassifier",
    "object-detection": "detection:ObjectDetector",
    "image-segmentation": "segmentation:SemanticSegmenter",
    "mask-generation": "mask_generation:MaskGenerator",
    "depth-estimation": "depth:DepthEstimator",
}

#: ``architectures`` suffixes -> task.
_SUFFIXES = (
    ("ForImageClassification", "image-classification"),
    ("ForImageClassificationWithTeacher", "image-classification"),
    ("ForObjectDetection", "object-detection"),
    ("ForSemanticSegmentation", "image-segmentation"),
    ("ForDepthEstimation", "depth-estimation"),
)
#: ``model_type`` values of image-text models served as zero-shot classifiers.
_ZERO_SHOT_TYPES = frozenset({"clip", "siglip", "siglip2", "chinese_clip", "altclip"})


def infer_task(config: Mapping[str, Any]) -> str | None:
    """The task a ``config.json`` describes, or None when it says nothing we serve."""
    for arch in config.get("architectures") or ():
        arch = str(arch)
        for suffix, task in _SUFFIXES:
            if arch.endswith(suffix):
                return task
        if arch == "SamModel":
            return "mask-generation"
    model_type = str(config.get("model_type", ""))
    if model_type in _ZERO_SHOT_TYPES:
        return "zero-shot-image-classification"
    if model_type == "sam":
        return "mask-generation"
    return None


def task_class(task: str) -> type:
    """The ServedModel class serving ``task`` (ModelLoadError for an unknown task)."""
    target = TASKS.get(task)
    if target is None:
        raise ModelLoadError(f"unknown task {task!r}; known: {', '.join(sorted(TASKS))}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attr)


def resolve_task(options: Mapping[str, Any], root: Path) -> str:
    """``options["task"]``, or the task the directory's config names."""
    task = options.get("task")
    if task is not None:
        if not isinstance(task, str) or task not in TASKS:
            raise ModelLoadError(f"unknown task {task!r}; known: {', '.join(sorted(TASKS))}")
        return task
    directory = directory_of(options, root)
    config = read_config(directory)
    found = infer_task(config)
    if found is None:
        raise ModelLoadError(
            f"{directory}: config.json (architectures {config.get('architectures')}, "
            f"model_type {config.get('model_type')!r}) names no task served here; set "
            f"task = one of {', '.join(sorted(TASKS))}"
        )
    return found


def create(options: Mapping[str, Any], root: Path) -> Model:
    """The task model of the directory ``options`` names, set up (see module doc)."""
    from mortred_twisted.models.transformers_tasks.contract import (
        CONTRACT_OPTION,
        MORTRED_V1,
        contract_of,
        create_v1,
    )
    from mortred_twisted.sdk.loading import build_sdk_model

    contract = contract_of(options)
    options = {k: v for k, v in options.items() if k != CONTRACT_OPTION}
    task = resolve_task(options, root)
    if contract == MORTRED_V1:
        return create_v1(task, {k: v for k, v in options.items() if k != "task"}, root)
    return build_sdk_model(task_class(task), options, root)
