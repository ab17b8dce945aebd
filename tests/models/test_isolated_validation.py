"""Process workers: the server validates requests without a model of its own (issue 18
item 4) — each worker process sends back a weightless validation twin."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest
from mortred_twisted.models import fake
from mortred_twisted.models.isolated import IsolatedModel, validation_twin

OPTIONS = {"fake_delay_ms": 0, "fake_steps": 2}


def req(**params) -> InferenceRequest:
    return InferenceRequest(req_id="r", images=(b"img",), params=params)


def test_the_server_process_never_builds_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no local model given, building the model in the server would fail here;
    validation still names the bad field and fills defaults, from the worker's twin."""

    def refuse(*_a: object) -> None:
        raise AssertionError("the model was built in the server process")

    monkeypatch.setattr(fake.FakeModel, "setup", refuse)
    model = IsolatedModel("fake", OPTIONS, Path("."))
    try:
        with pytest.raises(InvalidRequest, match=r"params\.mode"):
            model.validate(req(mode="warp"))
        assert model.validate(req()).params is not None
        assert model.params_schema and model.uses_images
    finally:
        model.close()


def test_a_twin_validates_like_its_model_and_carries_no_weights() -> None:
    """The twin pickles small (the declaration as JSON, no instance) and answers every
    validation exactly as the loaded model does."""
    real = fake.create(OPTIONS, Path("."))
    packed = pickle.dumps(validation_twin(real))
    twin = pickle.loads(packed)
    assert type(twin) is type(real)
    assert twin.instance is None and b"mortred_twisted.models.fake" not in packed
    assert twin.params_schema == real.params_schema and twin.uses_images
    for params in ({}, {"steps": 3}, {"mode": "warp"}, {"unknown": 1}):
        outcomes = []
        for model in (real, twin):
            try:
                outcomes.append(model.validate(req(**params)).params)
            except InvalidRequest as exc:
                outcomes.append((exc.field, exc.message))
        assert outcomes[0] == outcomes[1], params
