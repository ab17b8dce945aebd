"""Links that open Try-it on a model, and params hints from its declared inputs, under
node (tests/supervisor/ui_harness.js; issue 36.4): the page opened at ``#try=<id>``
picks that model, the servers table links each model, a followed link switches, an
unknown id is said so as text, the address follows what is open; counts agree with
their nouns ("at least 1 character")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from .test_ui_form_node import BUILTIN_PARAMS, CATALOG, NASTY, SDK_PARAMS, openapi
from .test_ui_node import run_ui

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")

STATUS = {
    "servers": [
        {"id": "gateway", "kind": "gateway", "category": "control", "state": "running",
         "ready": True, "pid": 10, "restart_count": 0, "last_exit": None, "error": None},
        {"id": "SHARPEN", "kind": "model", "category": "examples", "state": "running",
         "ready": True, "pid": 11, "restart_count": 0, "last_exit": None, "error": None,
         "replicas": [{"id": "SHARPEN@1", "kind": "replica", "state": "running", "ready": True,
                       "pid": 12, "restart_count": 0}]},
        {"id": "FAKE_ASYNC", "kind": "model", "category": "fake", "state": "running",
         "ready": True, "pid": 13, "restart_count": 0, "last_exit": None, "error": None},
    ]
}  # fmt: skip
#: A text input of at least one character, a list of at most one file, at most 1 item.
SINGULAR = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": 100},
        "masks": {"type": "array", "maxItems": 1,
                  "items": {"type": "string", "format": "byte", "x-mortred-kind": "image"}},
        "words": {"type": "string", "minLength": 2},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    scripted = {
        "hash": "#token=ui-token&try=FAKE_ASYNC",
        "follow": "#try=SHARPEN",
        "unknown": "#try=" + NASTY,
        "GET /api/v1/status": {"status": 200, "body": STATUS},
        "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
        "GET /api/v1/models/SHARPEN/openapi.json": {
            "status": 200, "body": openapi(SINGULAR, {"name": "Sharpen", "inputs": []})},
        "GET /api/v1/models/FAKE_ASYNC/openapi.json": {
            "status": 200, "body": openapi(BUILTIN_PARAMS)},
        "example_docs": [
            openapi(SDK_PARAMS, {"name": "S"}),
            openapi({"type": "object", "properties": {}}),
            openapi({"type": "object", "properties": {
                "image": {"type": "string", "x-mortred-kind": "image"},
                "flag": {"type": "boolean"}, "n": {"type": "integer", "minimum": 3},
                "words": {"type": "array", "items": {"type": "string"}}}}),
            {"no": "document"},
        ],
    }  # fmt: skip
    return run_ui(tmp_path_factory.mktemp("links"), scripted, mode="link")


def test_the_page_opened_at_a_try_link_shows_that_model(ui: dict[str, Any]) -> None:
    """#try=FAKE_ASYNC (not the catalog's first model): its form and params example;
    the token leaves the address, the choices stay in it."""
    opened = ui["opened"]
    assert opened["model"] == "FAKE_ASYNC" and opened["fields"] == "FAKE_ASYNC"
    assert json.loads(opened["tryPlaceholder"]) == {"delay_ms": 0, "mode": "sleep"}
    assert "timesteps" not in opened["tryPlaceholder"]
    assert "try=FAKE_ASYNC" in opened["hash"] and "token" not in opened["hash"]
    assert all("token" not in a for a in ui["addresses"][1:])


def test_the_servers_table_links_each_model_to_try_it(ui: dict[str, Any]) -> None:
    """One link per model (not the gateway, not a replica's row)."""
    assert ui["links"] == [
        {"id": "SHARPEN", "href": "#try=SHARPEN", "text": "try it"},
        {"id": "FAKE_ASYNC", "href": "#try=FAKE_ASYNC", "text": "try it"},
    ]


def test_a_followed_link_switches_the_model(ui: dict[str, Any]) -> None:
    followed = ui["followed"]
    assert followed["model"] == followed["fields"] == "SHARPEN"
    assert json.loads(followed["tryPlaceholder"]) == {"prompt": "text", "words": "text"}
    assert "try=SHARPEN" in followed["hash"]


def test_an_unknown_model_in_a_link_is_said_so_and_changes_nothing(ui: dict[str, Any]) -> None:
    unknown = ui["unknown"]
    assert unknown["model"] == "SHARPEN"
    assert unknown["state"] == f"no model {NASTY} in the catalog"  # as text, never HTML
    assert "try=SHARPEN" in unknown["hash"]


def test_counts_agree_with_their_nouns(ui: dict[str, Any]) -> None:
    """`at least 1 character`, `at most 1 file`; plurals otherwise."""
    hints = ui["followed"]["hints"]
    assert "at least 1 character" in hints[0] and "characters" not in hints[0]
    assert "at most 1 file" in hints[1] and "files" not in hints[1]
    assert "at least 2 characters" in hints[2]
    assert ui["plurals"] == ["1 item", "2 items", "1 character", "0 files"]


def test_params_examples_from_declared_inputs(ui: dict[str, Any]) -> None:
    """Defaults first; files skipped; values of their type otherwise; {} for no inputs;
    a plain hint without a document."""
    examples = [json.loads(e) for e in ui["examples"]]
    assert examples[0] == {"amount": 1.0, "mode": "unsharp"}
    assert examples[1] == {}
    assert examples[2] == {"flag": True, "n": 3}
    assert examples[3] == {}
    assert ui["noDoc"] == "a JSON object"


def test_the_static_page_has_no_fixed_params_example() -> None:
    from mortred_twisted.http.supervisor_api import STATIC

    assert "timesteps" not in (Path(STATIC) / "index.html").read_text()
