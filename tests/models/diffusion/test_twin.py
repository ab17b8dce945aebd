"""The diffusion families declared with the SDK: a validation twin (the declaration's
JSON, no weights: what process workers and the gateway's admission at zero replicas
validate with) answers every request exactly as the loaded model, and the params the
OpenAPI document publishes are the seed's."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from mortred_twisted.config.server import ServerConfig
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest, Model
from mortred_twisted.models.diffusion.schedulers import NAMES
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.sdk.seed_contract import sdk_declaration

FAMILIES = ["DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]

#: Every kind of request the seed's rules tell apart: not an object, unknown keys (with
#: and without a close match), each param's type and both bounds, the renamed params
#: (alone, both names, a bad value under the old name), eta's rule (given, null,
#: renamed scheduler, default dropped), the class params, several problems at once.
CASES: list[Any] = [
    None, {}, [], "x", {"bogus": 1}, {"sampel_steps": 3}, {"scheduler": "ddim"},
    {"scheduler": "ddpm"}, {"scheduler": "nope"}, {"scheduler": 3}, {"sample_steps": 0},
    {"sample_steps": 50}, {"sample_steps": 51}, {"sample_steps": 2.0}, {"sample_steps": 2.5},
    {"sample_steps": True}, {"timesteps": 3}, {"timesteps": 51}, {"timesteps": 0},
    {"timesteps": 3, "sample_steps": 3}, {"sampler": "ddim"}, {"sampler": "zzz"},
    {"sampler": "ddim", "scheduler": "ddim"}, {"eta": 0.5}, {"eta": 0.5, "scheduler": "ddpm"},
    {"eta": 0.5, "scheduler": "ddim"}, {"eta": 2}, {"eta": -0.1, "scheduler": "ddim"},
    {"eta": None, "scheduler": "ddpm"}, {"eta": None}, {"eta": 0.3, "sampler": "ddpm"},
    {"eta": 1, "sampler": "ddim"}, {"eta": "a", "scheduler": "euler"}, {"seed": -1},
    {"seed": 2**63}, {"seed": 2**63 - 1}, {"seed": 7}, {"seed": None}, {"seed": "7"},
    {"num_images": 0}, {"num_images": 4}, {"num_images": 5}, {"predicted_x0": 1},
    {"predicted_x0": True}, {"class_id": 0}, {"class_id": 9}, {"class_id": 10},
    {"class_id": -1}, {"class_id": 2.0}, {"guidance_scale": 0}, {"guidance_scale": 21},
    {"guidance_scale": 1.5}, {"guidance_scale": "a"}, {"guidance_scale": float("nan")},
    {"class_id": 3, "guidance_scale": 3, "scheduler": "ddim", "eta": 0.2},
    {"scheduler": "dpmsolver++", "sample_steps": 3}, {"scheduler": "euler-ancestral", "eta": 0.1},
    {"num_images": 2, "sample_steps": 60, "bogus": 1}, {"sample_steps": 99, "num_images": 99},
    *({"scheduler": name, "sample_steps": 4, "eta": 0.0} for name in NAMES),
]  # fmt: skip


def outcome(model: Model, params: Any, images: tuple[bytes, ...] = ()) -> tuple[Any, ...]:
    """What validation answers: the normalised params, or the 422's field and message."""
    try:
        checked = model.validate(InferenceRequest(req_id="r", images=images, params=params))
    except InvalidRequest as exc:
        return ("422", exc.field, exc.message)
    return ("ok", checked.params)


def twin_of(model: SdkModel) -> Model:
    """The model's validation twin as another process receives it (pickled: JSON)."""
    return pickle.loads(pickle.dumps(model.validation_twin()))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_twin_validates_every_case_exactly_as_the_loaded_model(
    build: Callable[..., Any], family: str
) -> None:
    """For every case the twin (no weights, no instance) gives the loaded model's
    normalised params, or its 422 with the same field and message."""
    model = build(family)
    twin = twin_of(model)
    assert getattr(twin, "instance", None) is None
    for params in CASES:
        assert outcome(twin, params) == outcome(model, params), params
    assert twin.uses_images is model.uses_images is False
    assert outcome(twin, {"seed": 1}, (b"not a picture",)) == outcome(model, {"seed": 1})


def test_the_seed_rules_hold_on_the_twin(build: Callable[..., Any]) -> None:
    """The rename messages, eta's rule (a given value or null with another scheduler,
    a default dropped) and the configured bounds are the twin's own."""
    twin = twin_of(build("DDPM"))
    assert outcome(twin, {"timesteps": 51}) == (
        "422", "params.timesteps", "must be <= 50 (got 51) (timesteps is now sample_steps)",
    )  # fmt: skip
    assert outcome(twin, {"sampler": "ddim", "scheduler": "ddim"}) == (
        "422", "params.sampler", "replaced by params.scheduler; give only scheduler",
    )  # fmt: skip
    for eta in (0.5, None):
        assert outcome(twin, {"eta": eta}) == (
            "422", "params.eta", "applies only to scheduler 'ddim' (scheduler is 'ddpm')",
        )  # fmt: skip
    assert outcome(twin, {}) == (
        "ok", {"scheduler": "ddpm", "sample_steps": 50, "num_images": 1, "predicted_x0": False},
    )  # fmt: skip
    assert outcome(twin, {"sampler": "ddim"})[1]["eta"] == 0.0
    cond = twin_of(build("CLS_COND_DDIM"))
    assert outcome(cond, {"class_id": 10}) == ("422", "params.class_id", "must be <= 9 (got 10)")
    assert outcome(cond, {"num_images": 5}) == ("422", "params.num_images", "must be <= 4 (got 5)")


SCHEDULER = {
    "type": "string", "enum": list(NAMES),
    "description": "sampler (diffusers scheduler); formerly 'sampler', still accepted",
}  # fmt: skip
STEPS = {
    "type": "integer", "minimum": 1, "maximum": 50,
    "description": "denoising steps, spread over the trained schedule; formerly "
    "'timesteps' (DDPM), still accepted",
}  # fmt: skip
ETA = {
    "type": "number", "minimum": 0.0, "maximum": 1.0,
    "description": "scheduler 'ddim' only: 0 = deterministic, 1 = DDPM-like noise",
}  # fmt: skip
COMMON = {
    "seed": {
        "type": "integer", "minimum": 0, "maximum": 2**63 - 1,
        "description": "random seed; absent = a fresh one, echoed in data.seed",
    },
    "num_images": {
        "type": "integer", "minimum": 1, "maximum": 4, "default": 1,
        "description": "images sampled together in one batch",
    },
    "predicted_x0": {
        "type": "boolean", "default": False,
        "description": "also return snapshots of the predicted clean image",
    },
}  # fmt: skip
CLASS_PARAMS = {
    "class_id": {
        "type": "integer", "minimum": 0, "maximum": 9,
        "description": "class to draw; absent = drawn per image from the seed",
    },
    "guidance_scale": {
        "type": "number", "minimum": 0.0, "maximum": 20.0, "default": 2.0,
        "description": "classifier-free guidance: 0 = unconditional, 1 = conditional "
        "without guidance, > 1 = eps_u + s (eps_c - eps_u) (one batched pass of 2B)",
    },
}  # fmt: skip
#: (default scheduler, default sample_steps, default eta) with the tests' options
DEFAULTS = {
    "DDPM": ("ddpm", 50, 0.0),
    "DDIM": ("ddim", 5, 0.5),
    "CLS_COND_DDIM": ("ddim", 5, 0.0),
    "LDM": ("ddim", 5, 0.0),
}


def published_params(model: Model) -> dict[str, Any]:
    """``params`` of the Request schema, as the model port's /openapi.json builds it."""
    config = ServerConfig(id=type(model).__name__, async_enabled=True)
    doc = build_openapi(config, model.params_schema, model.output_schema, sdk_declaration(model))
    return doc["components"]["schemas"]["Request"]["properties"]["params"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_openapi_params_are_the_seeds(build: Callable[..., Any], family: str) -> None:
    """The published params (order, types, bounds, defaults, descriptions) are those of
    the hand-written families, for the model and for its twin alike."""
    scheduler, steps, eta = DEFAULTS[family]
    expected = {
        "scheduler": {**SCHEDULER, "default": scheduler},
        "sample_steps": {**STEPS, "default": steps},
        "eta": {**ETA, "default": eta},
        **COMMON,
        **(CLASS_PARAMS if family == "CLS_COND_DDIM" else {}),
    }
    model = build(family, eta=0.5) if family == "DDIM" else build(family)
    for served in (model, twin_of(model)):
        params = published_params(served)
        assert params["additionalProperties"] is False
        assert list(params["properties"]) == list(expected)
        assert params["properties"] == expected
