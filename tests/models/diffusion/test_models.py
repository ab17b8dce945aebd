"""Contract tests of the four diffusion families over tiny random weights."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mortred_twisted.models.base import (
    InferenceRequest,
    InvalidRequest,
    RunCancelled,
    RunContext,
)

FAMILIES = ["DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]
STEP_PARAM = {
    "DDPM": "timesteps",
    "DDIM": "sample_steps",
    "CLS_COND_DDIM": "sample_steps",
    "LDM": "sample_steps",
}


def run(model: Any, params: dict[str, Any], ctx: RunContext | None = None) -> dict[str, Any]:
    request = model.validate(InferenceRequest(req_id="t", params=params))
    return model.run(request, ctx or RunContext())


def decode(b64: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
        assert img.format == "PNG"
        return np.asarray(img)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_data_shape(build: Callable[..., Any], family: str) -> None:
    """A run returns num_images decodable 16x16 grayscale PNGs and echoes steps/seed/sampler."""
    model = build(family)
    data = run(model, {STEP_PARAM[family]: 3, "seed": 7, "num_images": 2})
    assert len(data["images"]) == 2
    for b64 in data["images"]:
        pixels = decode(b64)
        assert pixels.shape == (16, 16) and pixels.dtype == np.uint8
    assert (data["width"], data["height"], data["steps"], data["seed"]) == (16, 16, 3, 7)
    assert data["sampler"] == ("ddpm" if family == "DDPM" else "ddim")


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_bytes(build: Callable[..., Any], family: str) -> None:
    """The same seed gives byte-identical PNGs; another seed gives different ones."""
    model = build(family)
    params = {STEP_PARAM[family]: 3, "seed": 11, "num_images": 2, "eta": 0.5}
    if family == "DDPM":
        params.pop("eta")
    a, b = run(model, params), run(model, params)
    assert a["images"] == b["images"]
    c = run(model, {**params, "seed": 12})
    assert c["images"] != a["images"]


def test_seed_absent_is_echoed_and_replayable(build: Callable[..., Any]) -> None:
    """Without a seed the run picks one, reports it, and replaying it gives the same bytes."""
    model = build("DDPM")
    first = run(model, {"timesteps": 2})
    again = run(model, {"timesteps": 2, "seed": first["seed"]})
    assert again["images"] == first["images"]


@pytest.mark.parametrize("family", FAMILIES)
def test_progress_sees_every_step(build: Callable[..., Any], family: str) -> None:
    """ctx.progress is called after each of the n steps, in order, with total n."""
    seen: list[tuple[int, int]] = []
    run(
        build(family),
        {STEP_PARAM[family]: 6, "seed": 1},
        RunContext(lambda s, t: seen.append((s, t))),
    )
    assert seen == [(i, 6) for i in range(1, 7)]


@pytest.mark.parametrize("family", FAMILIES)
def test_cancellation_stops_within_one_step(build: Callable[..., Any], family: str) -> None:
    """A cancel requested during step 3 stops the run before step 4 starts."""
    seen: list[int] = []
    ctx: RunContext

    def on_progress(step: int, total: int) -> None:
        seen.append(step)
        if step == 3:
            ctx.cancel()

    ctx = RunContext(on_progress)
    with pytest.raises(RunCancelled):
        run(build(family), {STEP_PARAM[family]: 10, "seed": 1}, ctx)
    assert seen == [1, 2, 3]


def test_cancelled_before_start_runs_no_step(build: Callable[..., Any]) -> None:
    """A run whose flag is already set raises before the first network evaluation."""
    ctx = RunContext()
    ctx.cancel()
    with pytest.raises(RunCancelled):
        run(build("DDPM"), {"timesteps": 5}, ctx)
    assert ctx.last_progress is None


@pytest.mark.parametrize(
    ("family", "params", "field"),
    [
        ("DDPM", {"timestep": 3}, "params.timestep"),
        ("DDPM", {"timesteps": 51}, "params.timesteps"),
        ("DDPM", {"timesteps": 0}, "params.timesteps"),
        ("DDPM", {"num_images": 5}, "params.num_images"),
        ("DDPM", {"seed": -1}, "params.seed"),
        ("DDPM", {"seed": "x"}, "params.seed"),
        ("DDIM", {"eta": 1.5}, "params.eta"),
        ("DDIM", {"sample_steps": 51}, "params.sample_steps"),
        ("DDIM", {"predicted_x0": "yes"}, "params.predicted_x0"),
        ("CLS_COND_DDIM", {"class_id": 10}, "params.class_id"),
        ("CLS_COND_DDIM", {"guidance_scale": -1}, "params.guidance_scale"),
        ("LDM", {"sampler": "euler"}, "params.sampler"),
    ],
)
def test_invalid_params_name_the_field(
    build: Callable[..., Any], family: str, params: dict[str, Any], field: str
) -> None:
    """Unknown keys and out-of-range values raise InvalidRequest naming the field."""
    model = build(family)
    with pytest.raises(InvalidRequest) as err:
        model.validate(InferenceRequest(req_id="t", params=params))
    assert err.value.field == field


@pytest.mark.parametrize("family", FAMILIES)
def test_generative_models_need_no_pixels(build: Callable[..., Any], family: str) -> None:
    """uses_images is False: validation accepts an envelope without images."""
    model = build(family)
    assert model.uses_images is False
    model.validate(InferenceRequest(req_id="t"))


def test_ddim_predicted_x0_when_asked(build: Callable[..., Any]) -> None:
    """predicted_x0=true adds up to 8 decodable snapshots ending at the last step."""
    model = build("DDIM")
    data = run(model, {"sample_steps": 10, "seed": 3, "num_images": 2, "predicted_x0": True})
    snaps = data["predicted_x0"]
    assert 1 <= len(snaps) <= 8 and snaps[-1]["step"] == 10 and snaps[0]["step"] == 1
    assert all(len(s["images"]) == 2 for s in snaps)
    decode(snaps[0]["images"][0])
    assert "predicted_x0" not in run(model, {"sample_steps": 2, "seed": 3})


def test_cls_cond_echoes_classes(build: Callable[..., Any]) -> None:
    """class_id is echoed per image; without it classes are drawn from the seed."""
    model = build("CLS_COND_DDIM")
    data = run(model, {"sample_steps": 2, "seed": 5, "num_images": 3, "class_id": 4})
    assert data["class_ids"] == [4, 4, 4] and data["guidance_scale"] == 2.0
    drawn = run(model, {"sample_steps": 2, "seed": 5, "num_images": 3})["class_ids"]
    assert drawn == run(model, {"sample_steps": 2, "seed": 5, "num_images": 3})["class_ids"]
    assert all(0 <= c <= 9 for c in drawn)


@pytest.mark.parametrize("scale", [0.0, 1.0, 3.0])
def test_cls_cond_guidance_scales_run(build: Callable[..., Any], scale: float) -> None:
    """Unconditional, plain conditional and guided sampling all produce images."""
    data = run(build("CLS_COND_DDIM"), {"sample_steps": 2, "seed": 1, "guidance_scale": scale})
    assert len(data["images"]) == 1


def test_ldm_ddpm_sampler(build: Callable[..., Any]) -> None:
    """The LDM also samples its latents with the DDPM ancestral sampler."""
    data = run(build("LDM"), {"sample_steps": 3, "seed": 1, "sampler": "ddpm"})
    assert data["sampler"] == "ddpm" and decode(data["images"][0]).shape == (16, 16)
