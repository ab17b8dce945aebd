"""The SDK's conformance check (``mortred_twisted.testing.conformance``) over every
task model of ``type = "transformers"``, on the tiny public-layout directories."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from mortred_twisted.models.registry import create_model
from mortred_twisted.models.transformers_tasks.loader import task_class
from mortred_twisted.sdk import Context, Image
from mortred_twisted.testing.conformance import check
from tests.models.transformers_tasks.conftest import png

INPUTS = {"zero-shot-image-classification": {"labels": ["a cat", "a dog"]}}


@pytest.mark.parametrize(
    "task",
    [
        "image-classification",
        "zero-shot-image-classification",
        "object-detection",
        "image-segmentation",
    ],
)
def test_each_task_passes_the_conformance_check(layout, task: str) -> None:
    """Declaration, validation without torch, run, output against the declaration,
    and batching (an invalid item fails alone; items equal single runs) all pass."""
    inputs = {"image": Image(png(60, 40)), **INPUTS.get(task, {})}
    report = check(
        task_class(task), inputs, {"pretrained": str(layout(task))}, raise_on_problem=False
    )
    assert report.ok, str(report)


def test_depth_passes_the_conformance_check_but_for_float_rounding(layout) -> None:
    """Depth passes every check; batched maps may differ from single runs by float
    rounding of the batched kernels only: at most one 16-bit level per pixel."""
    directory = layout("depth-estimation")
    report = check(
        task_class("depth-estimation"),
        {"image": Image(png(60, 40))},
        {"pretrained": str(directory)},
        raise_on_problem=False,
    )
    failed = [c for c in report.checks if c.ok is False]
    assert all(c.name == "batch" and "differ from the same input" in c.detail for c in failed), str(
        report
    )
    model = create_model("transformers", {"pretrained": str(directory)}, Path("."))
    picture = Image(png(60, 40))
    alone = model.instance.predict(Context(), image=picture)
    batched = model.instance.predict_batch(Context(), [{"image": picture}] * 3)

    def levels(out) -> np.ndarray:
        return np.asarray(PILImage.open(io.BytesIO(out.depth.read())), dtype=np.int64)

    for many in batched:
        assert np.abs(levels(many) - levels(alone)).max() <= 1
        np.testing.assert_allclose(many.min, alone.min, rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(many.max, alone.max, rtol=1e-5, atol=1e-12)


def test_mask_generation_passes_the_conformance_check() -> None:
    """The SAM task (on the shipped SAM directory) passes, cancellation included:
    its module imports no torch until setup."""
    report = check(
        task_class("mask-generation"),
        {"image": Image(png(60, 40)), "points_per_side": 4, "points_per_batch": 4},
        {"pretrained": "weights/perception/sam_amg"},
        raise_on_problem=False,
    )
    assert report.ok, str(report)


def test_the_mask_generator_keys_are_the_amg_fields() -> None:
    """The declaration's copies of the AMG keys and mask bound match the generator."""
    from dataclasses import fields

    from mortred_twisted.models.transformers_tasks import mask_generation
    from mortred_twisted.models.transformers_tasks.sam import amg

    assert {f.name for f in fields(amg.AmgConfig)} == mask_generation.AMG_KEYS
    assert amg.MAX_MASKS == mask_generation.MAX_MASKS
