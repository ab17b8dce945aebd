"""Tiny pipeline directories built once per session (see builders.py), and the models
served from them (CPU, float32, one intra-op thread: the machine is shared)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mortred_twisted.model_api.base import Model
from mortred_twisted.models.registry import create_model
from tests.models.diffusers_pipelines import builders

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diffusers")
    return {
        "sd": builders.stable_diffusion(root / "sd"),
        "inpaint": builders.stable_diffusion(
            root / "inpaint", pipeline_class="StableDiffusionInpaintPipeline"
        ),
        "dit": builders.dit(root / "dit"),
        "ddpm": builders.ddpm(root / "ddpm"),
        "sdxl": builders.sdxl(root / "sdxl"),
    }


@pytest.fixture(scope="session")
def make_model(pipelines: dict[str, Path]) -> Iterator[Callable[..., Model]]:
    """``make_model("sd", task=..., **options)``: a model built as the server builds it."""
    made: list[Model] = []

    def make(name: str, **options: Any) -> Model:
        model = create_model("diffusers", {"path": str(pipelines[name]), **options}, Path("."))
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()
