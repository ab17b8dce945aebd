"""Quality of the trained models, measured by the judge (slow: hundreds of samples).

The published figures come from ``training/diffusion/evaluate.py`` at the default
schedules; these tests re-check the targets at 50 DDIM steps to stay within minutes.
"""

from __future__ import annotations

import pytest

from training.diffusion import evaluate

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model_id", ["DDIM", "LDM"])
def test_unconditional_samples_convince_the_judge(model_id: str) -> None:
    """Mean judge confidence over 100 samples is >= 0.8 and every digit appears."""
    fig = evaluate.main(
        ["--models", model_id, "--samples", "100", "--steps", "50", "--no-grid", "--no-record"]
    )[model_id]
    assert fig["mean_confidence"] >= 0.8, fig
    assert fig["classes_present"] == 10, fig


def test_class_conditional_samples_agree_with_the_class() -> None:
    """The judge agrees with the requested class_id on >= 90 % of 100 samples."""
    args = ["--models", "CLS_COND_DDIM", "--samples", "100", "--steps", "50"]
    fig = evaluate.main([*args, "--no-grid", "--no-record"])["CLS_COND_DDIM"]
    assert fig["agreement"] >= 0.9, fig
