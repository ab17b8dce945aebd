"""Fixtures: tiny random-weight diffusers pipelines with a valid manifest.

The nets are deliberately small (8/16 channels, 50 train timesteps) so that a run of
a few steps takes milliseconds; their samples are noise, which is all the contract
tests need. Tests that need the trained weights use the shipped configs instead.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.models.diffusion import builders

BASE_OPTIONS = {"device": "cpu", "max_images": 4}

OPTIONS: dict[str, dict[str, Any]] = {
    "DDPM": {**BASE_OPTIONS, "pretrained": "weights/diffusion/ddpm"},
    "DDIM": {**BASE_OPTIONS, "pretrained": "weights/diffusion/ddpm", "sample_steps": 5},
    "CLS_COND_DDIM": {
        **BASE_OPTIONS,
        "pretrained": "weights/diffusion/cls_cond_ddim",
        "sample_steps": 5,
        "guidance_scale": 2.0,
    },
    "LDM": {**BASE_OPTIONS, "pretrained": "weights/diffusion/ldm", "sample_steps": 5},
}


@pytest.fixture(scope="session")
def tiny_pipelines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project root holding tiny unconditional, conditional and latent pipelines."""
    root = tmp_path_factory.mktemp("diffusion-root")
    folder = root / "weights" / "diffusion"
    builders.tiny_unconditional(folder / "ddpm")
    builders.tiny_conditional(folder / "cls_cond_ddim")
    builders.tiny_latent(folder / "ldm")
    return root


@pytest.fixture
def tiny_root(tiny_pipelines: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny pipelines' root (tests may damage it)."""
    root = tmp_path / "root"
    shutil.copytree(tiny_pipelines, root)
    return root


@pytest.fixture
def build(tiny_pipelines: Path) -> Callable[..., Any]:
    """``build(type, **overrides)`` -> a model over the (shared, intact) tiny pipelines."""
    from mortred_twisted.models.registry import create_model

    def _build(model_type: str, **overrides: Any) -> Any:
        return create_model(model_type, {**OPTIONS[model_type], **overrides}, tiny_pipelines)

    return _build
