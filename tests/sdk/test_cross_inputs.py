"""``renamed_inputs`` and ``only_when`` on the default (SDK) contract, as on the seed's
(issue 36 item 3): the loaded model, the harness, the in-memory server and the
validation twin the gateway admits with at zero replicas all check the same thing,
and the twin's answers are the loaded model's byte for byte."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image as PILImage

from mortred_twisted.config.server import build_server_config
from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest, ModelError
from mortred_twisted.model_api.input_limits import split_input_limits
from mortred_twisted.runtime.validation_twin import parse_twin, twin_document
from mortred_twisted.sdk import Context, DeclarationError, Image, Input, ServedModel, declare
from mortred_twisted.sdk.loading import build_sdk_model
from mortred_twisted.sdk.validation import Upload
from mortred_twisted.testing import MemoryServer, ModelHarness


def png(width: int = 4, height: int = 4) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (9, 8, 7)).save(buf, "PNG")
    return buf.getvalue()


class Sampler(ServedModel):
    """A sampler of the default contract with a renamed input and a conditional one."""

    renamed_inputs = {"timesteps": "sample_steps", "picture": "init_image"}

    def predict(
        self,
        ctx: Context,
        scheduler: str = Input("ddim", choices=["ddim", "ddpm"]),
        sample_steps: int = Input(10, ge=1, le=50),
        eta: float = Input(0.0, ge=0.0, le=1.0, only_when={"scheduler": ["ddim"]}),
        init_image: Image | None = None,
    ) -> dict[str, Any]:
        ctx.progress(1, 1)
        size = list(init_image.to_pil().size) if init_image is not None else None
        return {"scheduler": scheduler, "steps": sample_steps, "eta": eta, "size": size}


class NeedsSeedWhen(ServedModel):
    """A required input that applies only under one mode, and a chain on it."""

    def predict(
        self,
        mode: str = Input("plain", choices=["plain", "seeded"]),
        seed: int = Input(ge=0, only_when={"mode": ["seeded"]}),
        jitter: float = Input(0.5, ge=0.0, le=1.0, only_when={"seed": [1, 2, 3]}),
    ) -> dict[str, Any]:
        return {"mode": mode, "seed": seed, "jitter": jitter}


TARGET = f"{__name__}:Sampler"


def outcome(model: Any, params: Any, images: tuple[bytes, ...] = ()) -> str:
    """What validating ``params`` gave, as bytes a client would compare."""
    try:
        checked = model.validate(InferenceRequest(req_id="r", images=images, params=params))
    except ModelError as exc:
        return f"{type(exc).__name__}: {exc}"
    return json.dumps([checked.params, [base64.b64encode(b).decode() for b in checked.images]])


def refused(params: dict[str, Any], model: type = Sampler) -> tuple[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        ModelHarness(model).validate(params)
    return caught.value.field, caught.value.message


def test_a_renamed_input_is_accepted_under_its_old_name() -> None:
    """timesteps (old) reaches predict as sample_steps; an image input renamed too."""
    harness = ModelHarness(Sampler)
    assert harness.validate(timesteps=5)["sample_steps"] == 5
    result = harness.run(timesteps=3, picture=png(6, 2))
    assert result.output == {"scheduler": "ddim", "steps": 3, "eta": 0.0, "size": [6, 2]}


def test_errors_about_a_renamed_input_name_the_old_name() -> None:
    """A bound, a type, both names at once: the 422 names what the request sent."""
    assert refused({"timesteps": 99}) == (
        "params.timesteps",
        "must be <= 50 (got 99) (timesteps is now sample_steps)",
    )
    assert refused({"timesteps": "many"}) == (
        "params.timesteps",
        "must be an integer (timesteps is now sample_steps)",
    )
    assert refused({"timesteps": 5, "sample_steps": 5}) == (
        "params.timesteps",
        "replaced by params.sample_steps; give only sample_steps",
    )
    field, message = refused({"picture": "%%%"})
    assert field == "params.picture" and "(picture is now init_image)" in message
    # the new name keeps its own errors
    assert refused({"sample_steps": 0})[0] == "params.sample_steps"


def test_an_only_when_input_given_while_its_condition_is_false_is_a_422() -> None:
    """eta with scheduler ddpm: refused, and its default is not filled in."""
    assert refused({"scheduler": "ddpm", "eta": 0.5}) == (
        "params.eta",
        "applies only to scheduler 'ddim' (scheduler is 'ddpm')",
    )
    harness = ModelHarness(Sampler)
    assert "eta" not in harness.validate(scheduler="ddpm")
    assert harness.validate(scheduler="ddim")["eta"] == 0.0
    assert harness.validate(scheduler="ddim", eta=0.25)["eta"] == 0.25
    # null is "not given" on this contract: no 422, no default
    assert "eta" not in harness.validate(scheduler="ddpm", eta=None)
    assert harness.run(scheduler="ddpm").output["eta"] is None  # predict gets None


def test_a_required_only_when_input_is_required_only_while_it_applies() -> None:
    """seed is required under mode seeded only; jitter applies only under seed 1-3,
    which applies only under seeded (a chain reads the same in any order)."""
    harness = ModelHarness(NeedsSeedWhen)
    assert harness.validate() == {"mode": "plain"}
    assert refused({"mode": "seeded"}, NeedsSeedWhen) == ("params.seed", "is required")
    assert harness.validate(mode="seeded", seed=2) == {"mode": "seeded", "seed": 2, "jitter": 0.5}
    assert harness.validate(mode="seeded", seed=7) == {"mode": "seeded", "seed": 7}
    assert refused({"seed": 2}, NeedsSeedWhen) == (
        "params.seed",
        "applies only to mode 'seeded' (mode is 'plain')",
    )
    assert refused({"jitter": 0.1}, NeedsSeedWhen) == (
        "params.jitter",
        "applies only to seed 1 or 2 or 3 (seed does not apply)",
    )


def test_a_loop_of_only_when_conditions_is_a_load_error() -> None:
    class Loops(ServedModel):
        def predict(
            self,
            a: int = Input(1, only_when={"b": [1]}),
            b: int = Input(1, only_when={"a": [1]}),
        ) -> dict:
            return {}

    with pytest.raises(DeclarationError, match="only_when conditions loop: a -> b -> a"):
        declare(Loops)


def test_the_openapi_schema_does_not_require_a_conditional_input() -> None:
    schema = declare(NeedsSeedWhen).inputs_schema()
    assert schema["required"] == []


def test_multipart_fields_follow_the_same_rules() -> None:
    """A form's text fields under an old name, and a conditional one, as JSON does."""
    model = build_sdk_model(Sampler, {}, Path("."))
    form = {"timesteps": "4", "picture": Upload(png(), "image/png", "p.png")}
    request = InferenceRequest(req_id="r", params=form, text_params=True)
    params = model.validate(request).params
    assert params["sample_steps"] == 4 and params["init_image"]["name"] == "p.png"
    bad = InferenceRequest(req_id="r", params={"scheduler": "ddpm", "eta": "0.1"}, text_params=True)
    with pytest.raises(InvalidRequest, match="applies only to scheduler"):
        model.validate(bad)


def test_the_in_memory_server_answers_them_on_the_wire() -> None:
    """The real routes: 202 under the old name (the job ran with it), 422s named."""
    with MemoryServer(TARGET) as server:
        doc = server.run(timesteps=7, scheduler="ddpm")
        assert doc["data"] == {"scheduler": "ddpm", "steps": 7, "eta": None, "size": None}
        answer = server.submit(scheduler="ddpm", eta=0.5)
        assert answer.code == 422
        assert answer.json()["error"] == (
            "invalid request: params.eta: applies only to scheduler 'ddim' (scheduler is 'ddpm')"
        )
        answer = server.submit(timesteps=0)
        assert answer.code == 422 and "(timesteps is now sample_steps)" in answer.json()["error"]


REQUESTS: list[tuple[Any, tuple[bytes, ...]]] = [
    ({}, ()),
    ({"timesteps": 5}, ()),
    ({"timesteps": 99}, ()),
    ({"timesteps": "x"}, ()),
    ({"timesteps": 5, "sample_steps": 6}, ()),
    ({"scheduler": "ddpm"}, ()),
    ({"scheduler": "ddpm", "eta": 0.5}, ()),
    ({"scheduler": "ddpm", "eta": None}, ()),
    ({"scheduler": "ddim", "eta": 2}, ()),
    ({"scheduler": "ddpm", "eta": 2}, ()),
    ({"picture": base64.b64encode(png()).decode()}, ()),
    ({"picture": base64.b64encode(b"not a picture").decode()}, ()),
    ({"picture": ""}, ()),
    ({"init_image": base64.b64encode(png(5000, 5000)).decode()}, ()),
    ({}, (png(),)),
    ({"picture": base64.b64encode(png()).decode()}, (png(),)),
    ({"eta": 0.1, "timesteps": 2}, ()),
    ({"etta": 1}, ()),
    ([1, 2], ()),
]


def test_the_validation_twin_answers_like_the_loaded_model_byte_for_byte() -> None:
    """The document a replica publishes (and the gateway admits with at zero
    replicas) and a process worker's twin give the loaded model's exact answers."""
    doc = {"server": {"id": "SAMPLER", "async_enabled": True}, "model": {"type": TARGET}}
    config = build_server_config(doc, env={}, read_model_file=False)
    limits, _ = split_input_limits(TARGET, {})
    loaded = build_sdk_model(Sampler, {}, Path("."), input_limits=limits)
    published = parse_twin(twin_document(loaded, config), config)
    assert published.twin is not None, published.why
    worker_twin = loaded.validation_twin()
    for params, images in REQUESTS:
        expected = outcome(loaded, params, images)
        assert outcome(published.twin, params, images) == expected, params
        assert outcome(worker_twin, params, images) == expected, params
    # the cases do reach each rule (a twin that admitted everything would not pass)
    answers = [outcome(loaded, p, i) for p, i in REQUESTS]
    assert sum(a.startswith("InvalidRequest") for a in answers) >= 8
    assert any("applies only to scheduler" in a for a in answers)
    assert any("(timesteps is now sample_steps)" in a for a in answers)
    assert any(a.startswith("UnreadableImage") for a in answers)
    assert any(a.startswith("InputTooLarge") for a in answers)
