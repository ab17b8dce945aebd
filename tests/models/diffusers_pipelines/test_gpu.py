"""On CUDA (skipped without one): a Stable Diffusion directory in float16 on the GPU
samples finite pictures, alone and batched within 2/255 of each other, and
bfloat16 with attention slicing and VAE tiling loads and samples."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device visible to torch on this machine"
)


def pixels(data: dict) -> list[np.ndarray]:
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(i["base64"]))), dtype=np.int16)
            for i in data["images"]]  # fmt: skip


def test_float16_alone_and_batched(make_model: Callable[..., Model]) -> None:
    """float16 on CUDA: two runs batched equal each alone within 2/255."""
    model = make_model("sd", device="cuda", dtype="float16", max_running_jobs=4)
    runs = [
        {"prompt": "a red circle", "seed": 1, "sample_steps": 4},
        {"prompt": "a blue square", "seed": 2, "sample_steps": 4, "guidance_scale": 2.0},
    ]
    batch = model.step_batch()
    assert batch is not None
    for key, params in enumerate(runs):
        batch.join(key, model.validate(InferenceRequest("g", params=params)), RunContext())
    outcomes: dict = {}
    while batch.active:
        outcomes.update(batch.step())
    for key, params in enumerate(runs):
        alone = model.run(model.validate(InferenceRequest("a", params=params)), RunContext())
        for a, b in zip(pixels(outcomes[key]), pixels(alone), strict=True):
            assert int(np.abs(a - b).max()) <= 2


def test_bfloat16_with_the_memory_options(make_model: Callable[..., Model]) -> None:
    """bfloat16, attention slicing and VAE tiling load and sample a picture."""
    model = make_model("sd", device="cuda", dtype="bfloat16", attention_slicing=True,
                       vae_tiling=True)  # fmt: skip
    params = {"prompt": "a", "seed": 1, "sample_steps": 3}
    data = model.run(model.validate(InferenceRequest("b", params=params)), RunContext())
    assert pixels(data)[0].shape == (32, 32, 3)
