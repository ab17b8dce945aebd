"""The try-it form under node (tests/supervisor/ui_harness.js, a fake DOM and a scripted
API): built from the model's OpenAPI document, an SDK model submitted as multipart
with its event stream's progress, previews and outputs and its result files shown as
they are (a missing file said so), a built-in model's fields merged into the JSON
envelope. The real-browser run is tests/control/test_web_ui.py."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from .test_ui_node import STATUS, event, run_ui

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")

CATALOG = {
    "servers": [
        {"id": "SHARPEN", "category": "examples", "async_enabled": True, "enabled": True},
        {"id": "FAKE_ASYNC", "category": "fake", "async_enabled": True, "enabled": True},
    ]
}
NASTY = '<img src=x onerror="alert(1)">'


def openapi(params: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"title": "t", "description": "Model type x"}
    if model is not None:
        info["x-mortred-model"] = model
    return {"info": info, "components": {"schemas": {"Request": {"properties": {
        "params": params}}}}}  # fmt: skip


#: Sharpen's params as the model serves them (http/openapi.py::_declare_inputs), plus a
#: boolean, a list of strings and a list of files.
SDK_PARAMS = {
    "type": "object", "additionalProperties": False, "required": ["image", "tags"],
    "properties": {
        "image": {"type": "string", "format": "byte", "x-mortred-kind": "image",
                  "description": "the picture " + NASTY},
        "amount": {"type": "number", "minimum": 0.0, "maximum": 4.0, "default": 1.0},
        "mode": {"type": "string", "enum": ["unsharp", "laplace"], "default": "unsharp"},
        "steps": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
        "keep": {"type": "boolean", "default": False},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "extras": {"type": "array", "maxItems": 4,
                   "items": {"type": "string", "format": "byte", "x-mortred-kind": "file"}},
    },
}  # fmt: skip
#: As the model server writes it: keys sorted (the declaration's order is in its inputs).
SORTED_SDK_PARAMS = {**SDK_PARAMS, "properties": dict(sorted(SDK_PARAMS["properties"].items()))}
BUILTIN_PARAMS = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000, "description": "run time"},
        "mode": {"type": "string", "enum": ["sleep", "cpu"]},
        "fail": {"type": "boolean"},
        "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    },
}  # fmt: skip
JOB = {"job_id": "job_s", "state": "pending", "poll_url": "/api/v1/jobs/SHARPEN/job_s",
       "result_url": "/api/v1/jobs/SHARPEN/job_s/result"}  # fmt: skip
FILES = "/api/v1/jobs/SHARPEN/job_s/files/"


def file_ref(name: str, content_type: str, url: str) -> dict[str, Any]:
    return {"url": url, "name": name, "content_type": content_type, "size": 2048, "sha256": "ab"}


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *[n for c in node["children"] for n in walk(c)]]


def fields(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each rendered field by input name: its label classes, control and hint."""
    out = {}
    for label in (n for n in walk(tree) if n["attrs"].get("data-field")):
        nodes = walk(label)
        control = next(n for n in nodes if "data-input" in n["attrs"])
        hint = next((n["text"] for n in nodes if "field-hint" in n["attrs"].get("class", "")), "")
        out[label["attrs"]["data-field"]] = {
            "label": label["attrs"]["class"],
            "tag": control["tag"],
            "attrs": control["attrs"],
            "value": control["value"],
            "checked": control["checked"],
            "hint": hint,
            "options": [n["text"] for n in nodes if n["tag"] == "option"],
        }
    return out


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    running = {**JOB, "state": "running", "progress": {"step": 1, "total": 3}}
    done = {**JOB, "state": "done", "progress": {"step": 3, "total": 3}}
    preview = file_ref("preview-0.png", "image/png", "/jobs/job_s/files/preview-0.png")
    output = {"code": 0, "msg": "success", "data": {
        "picture": file_ref("output.png", "image/png", FILES + "output.png"),
        "report": file_ref("report.txt", "text/plain", FILES + "report.txt"),
        "gone": file_ref("old.png", "image/png", FILES + "old.png"),
        "elsewhere": file_ref("x.png", "image/png", "https://evil.example/x.png"),
        "score": 0.5}}  # fmt: skip
    scripted = {
        "GET /api/v1/status": {"status": 200, "body": STATUS},
        "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
        "GET /api/v1/models/SHARPEN/openapi.json": {"status": 200, "body": openapi(
            SORTED_SDK_PARAMS, {"name": "Sharpen", "description": "Sharpens a picture.",
                                "inputs": [{"name": n} for n in SDK_PARAMS["properties"]]})},
        "GET /api/v1/models/FAKE_ASYNC/openapi.json": {"status": 200, "body": openapi(
            BUILTIN_PARAMS)},
        "POST /api/v1/infer": [
            {"status": 202, "body": JOB},
            {"status": 200, "body": {"code": 0, "msg": "success", "data": {"digest": "d"}}},
        ],
        "GET /api/v1/jobs/SHARPEN/job_s/events": {"status": 200, "sse": [
            event("state", running, 1),
            "id: m0\nevent: preview\ndata: " + json.dumps(preview) + "\n\n",
            "id: m1\nevent: output\ndata: " + json.dumps({"partial": NASTY}) + "\n\n",
            event("done", done, 2),
        ]},
        "GET /api/v1/jobs/SHARPEN/job_s/result": {"status": 200, "body": output},
        "GET /api/v1/jobs/SHARPEN/job_s/files/output.png": {"status": 200, "blob": "OUT"},
        # A running job's files are 409 until it is done: the preview loads after.
        "GET /api/v1/jobs/SHARPEN/job_s/files/preview-0.png": [
            {"status": 409, "body": {"error": "job not finished (state: running)"}},
            {"status": 200, "blob": "PRE"},
        ],
        "form": {
            "sdk": "SHARPEN", "builtin": "FAKE_ASYNC",
            "sdk_values": {"image": {"files": ["cat"]}, "steps": "3", "mode": "1",
                           "tags": "a, b", "extras": {"files": ["e1", "e2"]}},
            "sdk_params": '{"amount": 2}',
            "builtin_values": {"delay_ms": "5", "fail": True},
            "builtin_bad": ["sizes", "1, x"],
        },
    }  # fmt: skip
    return run_ui(tmp_path_factory.mktemp("form"), scripted, mode="form")


def test_an_sdk_model_gets_a_form_from_its_declared_inputs(ui: dict[str, Any]) -> None:
    """One control per input, in the declaration's order (the document's keys are
    sorted): file pickers (accept image/*, multiple for a list), a number with bounds
    and step, a select, a checkbox, a list as text; defaults filled in, required
    marked, the description shown as text; the plain image picker hidden."""
    f = fields(ui["sdkForm"]["fields"])
    assert list(f) == ["image", "amount", "mode", "steps", "keep", "tags", "extras"]
    image = f["image"]
    assert image["tag"] == "input" and image["attrs"]["type"] == "file"
    assert image["attrs"]["accept"] == "image/*" and "required" in image["attrs"]
    assert "required" in image["label"] and "multiple" not in image["attrs"]
    assert image["hint"] == "the picture " + NASTY  # as text
    amount = f["amount"]["attrs"]
    assert (amount["type"], amount["min"], amount["max"], amount["step"]) == (
        "number",
        "0",
        "4",
        "any",
    )
    assert f["amount"]["value"] == "1" and "required" not in f["amount"]["label"]
    steps = f["steps"]["attrs"]
    assert (steps["min"], steps["max"], steps["step"], f["steps"]["value"]) == (
        "1",
        "1000",
        "1",
        "10",
    )
    assert f["mode"]["tag"] == "select" and f["mode"]["options"] == ["unsharp", "laplace"]
    assert f["mode"]["value"] == "0"  # the default is selected, no blank choice
    assert f["keep"]["attrs"]["type"] == "checkbox" and f["keep"]["checked"] is False
    assert f["tags"]["attrs"]["type"] == "text" and "required" in f["tags"]["attrs"]
    assert "comma-separated, at most 3" in f["tags"]["hint"]
    extras = f["extras"]["attrs"]
    assert extras["type"] == "file" and "multiple" in extras and "accept" not in extras
    assert ui["sdkForm"]["imageHidden"] is True
    assert ui["sdkForm"]["about"] == "Sharpen: Sharpens a picture."


def test_an_sdk_submit_is_multipart_with_one_part_per_file(ui: dict[str, Any]) -> None:
    """The submit goes to /api/v1/infer?server_id=SHARPEN&async=1 as FormData: each
    picked file a part, the other inputs text fields (a list repeated), More params as
    the params part; no Content-Type of the page's own (the browser sets the boundary)."""
    submit = next(c for c in ui["calls"] if c["method"] == "POST")
    assert submit["path"] == "/api/v1/infer?server_id=SHARPEN&async=1"
    assert submit["contentType"] is None and submit["auth"] == "Bearer ui-token"
    assert submit["body"]["form"] == [
        ["image", {"file": "cat"}, "cat.png"],
        ["mode", "laplace"],
        ["steps", "3"],
        ["keep", "false"],
        ["tags", "a"],
        ["tags", "b"],
        ["extras", {"file": "e1"}, "e1.png"],
        ["extras", {"file": "e2"}, "e2.png"],
        ["params", '{"amount":2}'],
    ]


def test_an_sdk_job_shows_progress_previews_outputs_and_files(ui: dict[str, Any]) -> None:
    """The job's stream moves the bar and shows the preview (a stored file fetched with
    the token as a blob: URL, again once the job is done: 409 while it runs) and the
    streamed output (as text); the result shows its
    image in the grid, a download link for the text file, a file gone from the server
    as not available, and never fetches a URL of another origin."""
    run = ui["sdkRun"]
    assert run["progress"]["hidden"] is False
    assert run["progress"]["attrs"]["value"] == run["progress"]["attrs"]["max"] == "3"
    assert "job_s: done" in run["state"] and '"success"' in run["json"]
    preview = [n for n in walk(run["preview"]) if n["tag"] == "img"]
    assert [n["attrs"]["src"] for n in preview] == ["blob:PRE"]
    out = walk(run["output"])
    figures = {n["attrs"]["data-file"]: n for n in out if n["tag"] == "figure"}
    assert figures["output.png"]["attrs"]["data-state"] == "loaded"
    assert [n["attrs"]["src"] for n in walk(figures["output.png"]) if n["tag"] == "img"] == [
        "blob:OUT"
    ]
    assert figures["old.png"]["attrs"]["data-state"] == "missing"
    assert "not available: HTTP 404" in figures["old.png"]["text"]
    link = next(n for n in out if n["tag"] == "a")
    assert link["attrs"]["data-file"] == "report.txt" and "download report.txt" in link["text"]
    assert "text/plain, 2.0 KiB" in link["text"]
    assert any("x.png: not on this server" in n["text"] for n in out if n["tag"] == "span")
    fetched = [c["path"] for c in ui["calls"] if "/files/" in c["path"] or "evil" in c["path"]]
    assert (
        sorted(fetched) == [FILES + "old.png", FILES + "output.png"] + [FILES + "preview-0.png"] * 2
    )
    assert "report.txt" not in str(fetched)  # downloads are fetched on click only
    assert "blob:PRE" in ui["revoked"]  # the first run's blobs go with the next run
    assert all(n["tag"] != "img" or n["attrs"]["src"].startswith("blob:") for n in out)


def test_a_builtin_model_keeps_its_image_picker_and_the_json_envelope(
    ui: dict[str, Any],
) -> None:
    """A built-in (no x-mortred-model): its ParamSpecs' fields (an enum without a
    default gets a blank choice, nothing required) beside the image picker; a submit
    is the JSON envelope with `images` and the filled fields as params."""
    f = fields(ui["builtinForm"]["fields"])
    assert list(f) == ["delay_ms", "mode", "fail", "sizes"]
    assert ui["builtinForm"]["imageHidden"] is False
    assert f["mode"]["options"] == ["", "sleep", "cpu"] and f["mode"]["value"] == ""
    assert all("required" not in v["label"] for v in f.values())
    assert f["delay_ms"]["attrs"]["max"] == "600000" and f["delay_ms"]["value"] == ""
    sync = [c for c in ui["calls"] if c["method"] == "POST"][1]
    assert sync["path"] == "/api/v1/infer"
    body = json.loads(sync["body"])
    assert body == {"server_id": "FAKE_ASYNC", "images": ["QUJD"],
                    "params": {"delay_ms": 5, "fail": True}}  # fmt: skip
    assert "HTTP 200" in ui["builtinRun"]["state"]


def test_the_params_placeholder_comes_from_the_models_inputs(ui: dict[str, Any]) -> None:
    """No fixed {"timesteps": 10} (issue 36.4): the first two inputs that are no files,
    with their defaults (or a value of their type)."""
    assert json.loads(ui["sdkForm"]["placeholder"]) == {"amount": 1.0, "mode": "unsharp"}
    assert json.loads(ui["builtinForm"]["placeholder"]) == {"delay_ms": 0, "mode": "sleep"}


def test_a_bad_list_item_is_refused_before_any_request(ui: dict[str, Any]) -> None:
    """An integer list with a word in it: the page says which item, sends nothing."""
    assert ui["badState"] == "sizes[1]: must be an integer"
    assert ui["callsAfterBad"] == 0
