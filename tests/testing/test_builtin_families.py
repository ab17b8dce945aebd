"""The built-in families are the SDK's first users (issue 26 item 4): the harness,
the conformance check and ``mortredctl model check|run`` take a built-in type by
name, and its wire stays the seed's (the 422s of the envelope, params echoed as
given)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mortred_twisted.cli.mortredctl import main
from mortred_twisted.model_api.base import InvalidRequest
from mortred_twisted.models.fake import FakeModel
from mortred_twisted.models.registry import create_model
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.testing import conformance
from mortred_twisted.testing.harness import ModelHarness

FAST = {"fake_delay_ms": 20, "fake_steps": 4}


def test_the_registry_builds_the_fake_through_the_sdk() -> None:
    model = create_model("fake", {**FAST, "max_images": 2}, Path("."))
    assert isinstance(model, SdkModel) and isinstance(model.instance, FakeModel)
    assert model.declaration.contract == "mortred-v1"
    assert model.input_limits is not None and model.input_limits.max_images == 2


def test_the_harness_runs_a_builtin_by_name_with_the_seeds_messages() -> None:
    harness = ModelHarness("fake", FAST)
    result = harness.run(images=[b"abc", b"def"], steps=2)
    assert result.output["images"] == 2 and result.output["params"] == {"steps": 2}
    assert result.progress == [(1, 2), (2, 2)]
    with pytest.raises(InvalidRequest) as missing:
        harness.run()
    assert (missing.value.field, missing.value.message) == (
        "images",
        "at least one image is required",
    )
    with pytest.raises(InvalidRequest, match="unknown parameter"):
        harness.validate(images=[b"x"], stepz=1)


def test_the_fake_passes_the_conformance_check() -> None:
    report = conformance.check("fake", options=FAST, isolated=False)
    assert report.ok, report
    assert {c.name for c in report.checks if c.ok} >= {"validation", "run", "cancel", "batch"}


def test_mortredctl_model_check_takes_a_builtin_type() -> None:
    out = io.StringIO()
    code = main(["--json", "model", "check", "fake", "--no-isolated"], out=out)
    doc = json.loads(out.getvalue())
    assert code == 0, doc
    assert doc["schema"]["inputs"]["properties"]["mode"]["enum"] == list(
        ("sleep", "cpu", "python", "fail")
    )
    assert doc["schema"]["contract"] == "mortred-v1"
    assert doc["schema"]["output"]["properties"]["digest"]["type"] == "string"


def test_a_loader_type_is_not_one_declared_class() -> None:
    with pytest.raises(Exception, match="built-in loader of several declarations"):
        ModelHarness("transformers")
