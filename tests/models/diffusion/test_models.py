"""Contract tests of the four diffusion models over tiny random diffusers pipelines."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InvalidRequest,
    RunCancelled,
    RunContext,
)
from mortred_twisted.models.diffusion.schedulers import NAMES

FAMILIES = ["DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]
DEFAULT_SCHEDULER = {"DDPM": "ddpm", "DDIM": "ddim", "CLS_COND_DDIM": "ddim", "LDM": "ddim"}


def run(model: Any, params: dict[str, Any], ctx: RunContext | None = None) -> dict[str, Any]:
    request = model.validate(InferenceRequest(req_id="t", params=params))
    return model.run(request, ctx or RunContext())


def decode(b64: str) -> np.ndarray:
    with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
        assert img.format == "PNG"
        return np.asarray(img)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_data_shape(build: Callable[..., Any], family: str) -> None:
    """A run returns num_images 16x16 grayscale PNGs and echoes steps, seed and scheduler."""
    data = run(build(family), {"sample_steps": 3, "seed": 7, "num_images": 2})
    assert len(data["images"]) == 2
    for b64 in data["images"]:
        pixels = decode(b64)
        assert pixels.shape == (16, 16) and pixels.dtype == np.uint8
    assert (data["width"], data["height"], data["channels"]) == (16, 16, 1)
    assert (data["steps"], data["seed"]) == (3, 7)
    assert data["scheduler"] == data["sampler"] == DEFAULT_SCHEDULER[family]
    assert ("eta" in data) == (DEFAULT_SCHEDULER[family] == "ddim")


@pytest.mark.parametrize("scheduler", NAMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_listed_scheduler_samples(
    build: Callable[..., Any], family: str, scheduler: str
) -> None:
    """Each scheduler we list runs on each model, step count and progress as asked."""
    seen: list[tuple[int, int]] = []
    ctx = RunContext(lambda s, t: seen.append((s, t)))
    data = run(build(family), {"scheduler": scheduler, "sample_steps": 4, "seed": 1}, ctx)
    assert data["scheduler"] == scheduler and data["steps"] == 4
    assert seen == [(i, 4) for i in range(1, 5)]
    assert decode(data["images"][0]).shape == (16, 16)


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim", "dpmsolver++", "euler-ancestral"])
@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_bytes(build: Callable[..., Any], family: str, scheduler: str) -> None:
    """The same seed gives byte-identical PNGs; another seed gives different ones."""
    model = build(family)
    params = {"scheduler": scheduler, "sample_steps": 3, "seed": 11, "num_images": 2}
    if scheduler == "ddim":
        params["eta"] = 0.5
    a, b = run(model, params), run(model, params)
    assert a["images"] == b["images"]
    assert run(model, {**params, "seed": 12})["images"] != a["images"]


def test_seed_absent_is_echoed_and_replayable(build: Callable[..., Any]) -> None:
    """Without a seed the run picks one, reports it, and replaying it gives the same bytes."""
    model = build("DDPM")
    first = run(model, {"sample_steps": 2})
    again = run(model, {"sample_steps": 2, "seed": first["seed"]})
    assert again["images"] == first["images"]


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
        run(build(family), {"sample_steps": 10, "seed": 1}, ctx)
    assert seen == [1, 2, 3]


def test_cancelled_before_start_runs_no_step(build: Callable[..., Any]) -> None:
    """A run whose flag is already set raises before the first network evaluation."""
    ctx = RunContext()
    ctx.cancel()
    with pytest.raises(RunCancelled):
        run(build("DDPM"), {"sample_steps": 5}, ctx)
    assert ctx.last_progress is None


def test_old_param_names_still_work(build: Callable[..., Any]) -> None:
    """'timesteps' and 'sampler' (the previous names) map onto sample_steps and scheduler."""
    model = build("LDM")
    old = run(model, {"timesteps": 3, "sampler": "ddpm", "seed": 4})
    new = run(model, {"sample_steps": 3, "scheduler": "ddpm", "seed": 4})
    assert old["images"] == new["images"] and old["scheduler"] == "ddpm"


@pytest.mark.parametrize(
    ("family", "params", "field", "says"),
    [
        ("DDPM", {"timestep": 3}, "params.timestep", "unknown"),
        ("DDPM", {"sample_steps": 51}, "params.sample_steps", "<= 50"),
        ("DDPM", {"timesteps": 0}, "params.timesteps", ">= 1 (got 0) (timesteps is now"),
        ("DDPM", {"timesteps": 3, "sample_steps": 3}, "params.timesteps", "replaced by"),
        ("DDPM", {"num_images": 5}, "params.num_images", "<= 4"),
        ("DDPM", {"seed": -1}, "params.seed", ">= 0"),
        ("DDPM", {"seed": "x"}, "params.seed", "integer"),
        ("DDPM", {"scheduler": "plms"}, "params.scheduler", "one of"),
        ("DDPM", {"eta": 0.5}, "params.eta", "only to scheduler 'ddim'"),
        ("DDIM", {"eta": 1.5}, "params.eta", "<= 1"),
        ("DDIM", {"scheduler": "unipc", "eta": 0.0}, "params.eta", "only"),
        ("DDIM", {"predicted_x0": "yes"}, "params.predicted_x0", "boolean"),
        ("DDIM", {"class_id": 3}, "params.class_id", "unknown"),
        ("CLS_COND_DDIM", {"class_id": 10}, "params.class_id", "<= 9"),
        ("CLS_COND_DDIM", {"guidance_scale": -1}, "params.guidance_scale", ">= 0"),
        ("LDM", {"sampler": "heun"}, "params.sampler", "one of"),
    ],
)
def test_invalid_params_name_the_field(
    build: Callable[..., Any], family: str, params: dict[str, Any], field: str, says: str
) -> None:
    """Unknown, out-of-range and misplaced params raise InvalidRequest naming the field."""
    model = build(family)
    with pytest.raises(InvalidRequest) as err:
        model.validate(InferenceRequest(req_id="t", params=params))
    assert err.value.field == field and says in err.value.message


@pytest.mark.parametrize("family", FAMILIES)
def test_generative_models_need_no_pixels(build: Callable[..., Any], family: str) -> None:
    """uses_images is False: validation accepts an envelope without images."""
    model = build(family)
    assert model.uses_images is False
    model.validate(InferenceRequest(req_id="t"))


@pytest.mark.parametrize("scheduler", ["ddim", "dpmsolver++", "euler"])
def test_predicted_x0_when_asked(build: Callable[..., Any], scheduler: str) -> None:
    """predicted_x0=true adds up to 8 decodable snapshots ending at the last step."""
    model = build("DDIM")
    params = {"scheduler": scheduler, "sample_steps": 10, "seed": 3, "num_images": 2}
    data = run(model, {**params, "predicted_x0": True})
    snaps = data["predicted_x0"]
    assert 1 <= len(snaps) <= 8 and snaps[-1]["step"] == 10 and snaps[0]["step"] == 1
    assert all(len(s["images"]) == 2 for s in snaps)
    assert decode(snaps[0]["images"][0]).shape == (16, 16)
    assert "predicted_x0" not in run(model, params)


def test_cls_cond_echoes_classes(build: Callable[..., Any]) -> None:
    """class_id is echoed per image; without it classes are drawn from the seed."""
    model = build("CLS_COND_DDIM")
    data = run(model, {"sample_steps": 2, "seed": 5, "num_images": 3, "class_id": 4})
    assert data["class_ids"] == [4, 4, 4] and data["guidance_scale"] == 2.0
    drawn = run(model, {"sample_steps": 2, "seed": 5, "num_images": 3})["class_ids"]
    assert drawn == run(model, {"sample_steps": 2, "seed": 5, "num_images": 3})["class_ids"]
    assert all(0 <= c <= 9 for c in drawn)


@pytest.mark.parametrize(("scale", "batch"), [(0.0, 3), (1.0, 3), (3.0, 6)])
def test_guidance_is_one_batched_forward_of_2b(
    build: Callable[..., Any], scale: float, batch: int
) -> None:
    """Guided steps run the denoiser once on 2B inputs (B cond + B "no label"), else on B."""
    model = build("CLS_COND_DDIM")
    calls: list[tuple[int, list[int]]] = []
    net = model.instance.pipe.denoiser
    hook = net.register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append((args[0].shape[0], kwargs["class_labels"].tolist())),
        with_kwargs=True,
    )
    try:
        params = {"sample_steps": 2, "seed": 1, "num_images": 3, "class_id": 7}
        run(model, {**params, "guidance_scale": scale})
    finally:
        hook.remove()
    assert [n for n, _ in calls] == [batch, batch]
    expected = {0.0: [10] * 3, 1.0: [7] * 3, 3.0: [7] * 3 + [10] * 3}[scale]
    assert calls[0][1] == expected
