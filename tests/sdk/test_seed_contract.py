"""The seed's envelope for a declared model (contract "mortred-v1"), cross-input
declarations (renamed inputs, only_when) and constraints from the configuration
(issue 26 item 4: the built-in families are declared with the SDK)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest, RunContext
from mortred_twisted.model_api.params import ParamSpec, validate_params
from mortred_twisted.sdk import Context, DeclarationError, File, Image, Input, ServedModel
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.sdk.declaration import Declaration, declare
from mortred_twisted.sdk.loading import build_sdk_model
from mortred_twisted.sdk.seed_contract import sdk_declaration


class Sampler(ServedModel):
    """Draws pictures (a generator: no image input)."""

    contract = "mortred-v1"
    output_schema = {"type": "object"}
    renamed_inputs = {"timesteps": "sample_steps", "sampler": "scheduler"}

    def setup(self) -> None:
        self.trained = int(self.options.get("trained", 50))

    def configure_inputs(self) -> dict[str, Input]:
        return {"sample_steps": Input(self.trained, ge=1, le=self.trained)}

    def predict(
        self,
        ctx: Context,
        scheduler: str = Input("ddim", choices=["ddim", "ddpm"]),
        sample_steps: int = Input(10, ge=1, le=1000),
        eta: float = Input(0.0, ge=0.0, le=1.0, only_when={"scheduler": ["ddim"]}),
        seed: int = Input(None, ge=0),
    ) -> dict[str, Any]:
        ctx.progress(1, 1)
        return {"scheduler": scheduler, "steps": sample_steps, "eta": eta, "seed": seed}


class Reader(ServedModel):
    contract = "mortred-v1"

    def predict(self, images: list[Image], top_k: int = Input(None, ge=1, le=5)) -> dict:
        return {"n": len(images), "first": images[0].read().decode(), "top_k": top_k}


def req(images: tuple[bytes, ...] = (), **params: Any) -> InferenceRequest:
    return InferenceRequest(req_id="r", images=images, params=params)


def error(model: Any, request: InferenceRequest) -> tuple[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        model.validate(request)
    return caught.value.field, caught.value.message


@pytest.fixture
def sampler() -> SdkModel:
    return build_sdk_model(Sampler, {"trained": 40}, Path("."))


def test_params_follow_the_seeds_rules(sampler: SdkModel) -> None:
    """Defaults filled, absent-unless-given kept absent, the seed's own messages."""
    assert sampler.validate(req()).params == {"scheduler": "ddim", "sample_steps": 40, "eta": 0.0}
    field, message = error(sampler, req(sedd=3))
    assert field == "params.sedd"
    assert message == (
        "unknown parameter (did you mean 'seed'?); accepted: eta, sample_steps, scheduler, seed"
    )
    specs = sampler.params_schema
    for bad in ({"seed": -1}, {"scheduler": "euler"}, {"eta": True}, {"sample_steps": 2.5}):
        with pytest.raises(InvalidRequest) as direct:
            validate_params(specs, bad)
        assert error(sampler, req(**bad)) == (direct.value.field, direct.value.message)


def test_configured_constraints_replace_the_declared_ones(sampler: SdkModel) -> None:
    """configure_inputs() after setup: the bound read from the options holds."""
    assert error(sampler, req(sample_steps=41)) == ("params.sample_steps", "must be <= 40 (got 41)")
    spec = next(s for s in sampler.params_schema if s.name == "sample_steps")
    assert spec == ParamSpec("sample_steps", int, default=40, minimum=1, maximum=40)


def test_renamed_inputs_are_accepted_and_named_in_their_errors(sampler: SdkModel) -> None:
    assert sampler.validate(req(timesteps=5)).params["sample_steps"] == 5
    assert error(sampler, req(timesteps=0)) == (
        "params.timesteps",
        "must be >= 1 (got 0) (timesteps is now sample_steps)",
    )
    assert error(sampler, req(timesteps=5, sample_steps=5)) == (
        "params.timesteps",
        "replaced by params.sample_steps; give only sample_steps",
    )


def test_only_when_drops_a_default_and_refuses_a_given_value(sampler: SdkModel) -> None:
    assert "eta" not in sampler.validate(req(scheduler="ddpm")).params
    assert error(sampler, req(scheduler="ddpm", eta=0.5)) == (
        "params.eta",
        "applies only to scheduler 'ddim' (scheduler is 'ddpm')",
    )


def test_the_images_fill_the_image_input_and_are_required() -> None:
    reader = build_sdk_model(Reader, {}, Path("."))
    assert reader.uses_images and not reader.images_optional
    assert error(reader, req()) == ("images", "at least one image is required")
    checked = reader.validate(req((b"pic", b"two"), top_k=2))
    assert checked.images == (b"pic", b"two") and checked.params == {"top_k": 2}
    data = reader.run(checked, RunContext())
    assert data == {"n": 2, "first": "pic", "top_k": 2}


def test_a_generator_ignores_images_and_returns_its_data_as_it_is(sampler: SdkModel) -> None:
    assert not sampler.uses_images and sampler.images_optional
    checked = sampler.validate(req((b"ignored",), seed=7))
    ctx = RunContext()
    ctx.result_files = object()  # a seed model writes no result files
    assert sampler.run(checked, ctx) == {"scheduler": "ddim", "steps": 40, "eta": 0.0, "seed": 7}
    assert ctx.last_progress == (1, 1)
    assert sdk_declaration(sampler) is None and sampler.output_schema == {"type": "object"}


def test_the_twin_carries_the_refined_declaration(sampler: SdkModel) -> None:
    """A process worker's twin (JSON) validates as the loaded, configured model."""
    twin = pickle.loads(pickle.dumps(sampler.validation_twin()))
    for params in ({}, {"sample_steps": 41}, {"timesteps": 0}, {"scheduler": "ddpm", "eta": 1}):
        outcomes = []
        for model in (sampler, twin):
            try:
                outcomes.append(model.validate(req(**params)).params)
            except InvalidRequest as exc:
                outcomes.append((exc.field, exc.message))
        assert outcomes[0] == outcomes[1], params
    doc = sampler.declaration.to_json()
    assert Declaration.from_json(json.loads(json.dumps(doc))) == sampler.declaration


def _declare(**members: Any) -> Declaration:
    return declare(type("Bad", (ServedModel,), members))


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"contract": "v2"}, "contract must be one of"),
        ({"renamed_inputs": {"old": "missing"}}, "which is not declared"),
        ({"renamed_inputs": {"a": "a"}}, "is declared and also renamed"),
    ],
)
def test_bad_cross_input_declarations_are_load_errors(members: dict, reason: str) -> None:
    def predict(self: Any, a: int = Input(1)) -> dict:
        return {}

    with pytest.raises(DeclarationError, match=reason):
        _declare(predict=predict, **members)


def test_only_when_must_name_another_scalar_input_and_its_values() -> None:
    def nowhere(self: Any, a: int = Input(1, only_when={"b": [1]})) -> dict:
        return {}

    def bad_value(
        self: Any, m: str = Input("x", choices=["x"]), a: int = Input(1, only_when={"m": ["y"]})
    ) -> dict:
        return {}

    with pytest.raises(DeclarationError, match="not a declared scalar input"):
        _declare(predict=nowhere)
    with pytest.raises(DeclarationError, match="only_when value of m"):
        _declare(predict=bad_value)


@pytest.mark.parametrize(
    ("annotation", "default", "reason"),
    [
        (int, Input(), "needs a default"),
        (list[int], Input([1]), "scalar params"),
        (File, Input(None), "one list\\[Image\\] input"),
        (Image, Input(None), "one list\\[Image\\] input"),
        (str, Input("a", max_length=3), "bounds no lengths"),
    ],
)
def test_the_seed_contract_refuses_what_its_envelope_cannot_carry(
    annotation: Any, default: Input, reason: str
) -> None:
    def predict(self: Any, x: Any = default) -> dict:
        return {}

    predict.__annotations__ = {"x": annotation, "return": dict}
    with pytest.raises(DeclarationError, match=reason):
        _declare(predict=predict, contract="mortred-v1")


def test_a_configured_constraint_that_does_not_hold_is_a_load_error() -> None:
    class Broken(Sampler):
        def configure_inputs(self) -> dict[str, Input]:
            return {"sample_steps": Input(99, ge=1, le=self.trained)}

    class Unknown(Sampler):
        def configure_inputs(self) -> dict[str, Input]:
            return {"nope": Input(1)}

    with pytest.raises(DeclarationError, match=r"predict\(sample_steps\).*default 99"):
        build_sdk_model(Broken, {}, Path("."))
    with pytest.raises(DeclarationError, match="undeclared input"):
        build_sdk_model(Unknown, {}, Path("."))
