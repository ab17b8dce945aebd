"""One way to name a model (issue 38): the legacy perception type names are aliases
of ``type = "transformers"`` + ``task`` + ``contract = "mortred-v1"``; each builds what
its expansion builds, mixing one with ``task``/``contract`` is a load error saying
what to write, and docs/configuration.md prints the table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InferenceRequest, ModelLoadError, RunContext
from mortred_twisted.model_api.builtins import MODEL_ALIASES, MODEL_FACTORIES
from mortred_twisted.models.registry import alias_expansion, create_model
from mortred_twisted.models.transformers_tasks.contract import MORTRED_V1, V1_FAMILIES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("alias", sorted(MODEL_ALIASES))
def test_an_alias_names_the_adapter_its_expansion_builds(alias: str) -> None:
    """The alias's family is the mortred-v1 adapter of its task (no second class)."""
    expansion = MODEL_ALIASES[alias]
    assert expansion["type"] == "transformers" and expansion["contract"] == MORTRED_V1
    assert MODEL_FACTORIES[alias] == V1_FAMILIES[expansion["task"]]


def test_the_alias_and_its_expansion_answer_alike() -> None:
    """MOBILENETV2 and its expansion build the same class over the same weights and
    answer a digit with the same bytes (one implementation, built twice)."""
    options = tomllib.loads((ROOT / "conf/model/classification/mobilenetv2.toml").read_text())
    alias = create_model("MOBILENETV2", options, ROOT)
    expansion = {k: v for k, v in MODEL_ALIASES["MOBILENETV2"].items() if k != "type"}
    expanded = create_model("transformers", {**options, **expansion}, ROOT)
    assert type(alias.instance) is type(expanded.instance)
    picture = (ROOT / "demo_data/perception/digit_3.png").read_bytes()
    answers = [
        model.run(model.validate(InferenceRequest("a", (picture,), {"top_k": 2})), RunContext())
        for model in (alias, expanded)
    ]
    assert answers[0] == answers[1] and answers[0]["class_id"] == 3


@pytest.mark.parametrize("key", ["task", "contract"])
@pytest.mark.parametrize("alias", sorted(MODEL_ALIASES))
def test_an_alias_mixed_with_its_expansion_keys_says_what_to_write(alias: str, key: str) -> None:
    """``type = "SAM_AMG"`` with ``task = …`` (or ``contract``) fails at load, before
    any weights are read, naming the configuration to write instead."""
    with pytest.raises(ModelLoadError) as caught:
        create_model(alias, {key: "anything", "pretrained": "/nonexistent"}, ROOT)
    message = str(caught.value)
    assert f"type {alias!r} is an alias of {alias_expansion(alias)}" in message
    assert f"no {key} of its own" in message and "write those keys" in message


def test_the_configuration_guide_prints_the_alias_table() -> None:
    """docs/configuration.md has one row per alias with its whole expansion."""
    doc = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    for alias, expansion in MODEL_ALIASES.items():
        cells = " | ".join(f"`{expansion[k]}`" for k in ("type", "task", "contract"))
        assert f"| `{alias}` | {cells} |" in doc, alias
