"""The web UI's script runs under node against a scripted API (a fast check of app.js
logic; the real-browser test is tests/control/test_web_ui.py)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.http.supervisor_api import STATIC

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")

HERE = Path(__file__).parent
PNG = base64.b64encode(b"\x89PNG fake").decode()

STATUS = {
    "servers": [
        {"id": "gateway", "kind": "gateway", "category": "control", "state": "running",
         "ready": True, "pid": 10, "restart_count": 0, "last_exit": None, "error": None},
        {"id": "FAKE_ASYNC", "kind": "model", "category": "fake", "state": "running",
         "ready": True, "pid": 11, "restart_count": 2, "last_exit": None, "error": None},
        {"id": "DDPM", "kind": "model", "category": "diffusion", "state": "failed",
         "ready": False, "pid": None, "restart_count": 5,
         "last_exit": {"text": "exited with code 1"}, "error": "crash loop"},
    ]
}  # fmt: skip
CATALOG = {
    "servers": [
        {"id": "FAKE_ASYNC", "category": "fake", "async_enabled": True, "enabled": True},
        {"id": "DDPM", "category": "diffusion", "async_enabled": True, "enabled": True},
    ]
}


def run_ui(tmp_path: Path, scripted: dict[str, Any], mode: str = "async") -> dict[str, Any]:
    f = tmp_path / "scripted.json"
    f.write_text(json.dumps(scripted))
    out = subprocess.run(
        ["node", str(HERE / "ui_harness.js"), str(STATIC / "app.js"), str(f), mode],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def test_ui_renders_servers_follows_logs_and_runs_an_async_job(tmp_path: Path) -> None:
    """Servers grouped by category, a restart POST, log lines, and submit → wait → result."""
    job = {"job_id": "job_1", "poll_url": "/api/v1/jobs/FAKE_ASYNC/job_1",
           "result_url": "/api/v1/jobs/FAKE_ASYNC/job_1/result"}  # fmt: skip
    ui = run_ui(
        tmp_path,
        {
            "GET /api/v1/status": {"status": 200, "body": STATUS},
            "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
            "POST /api/v1/servers/gateway/restart": {"status": 202, "body": {}},
            "GET /api/v1/servers/gateway/logs": {
                "status": 200,
                "body": {"lines": ["hello", "world"], "next_offset": 2},
            },
            "POST /api/v1/infer": {"status": 202, "body": {**job, "state": "pending"}},
            "GET /api/v1/jobs/FAKE_ASYNC/job_1/wait": [
                {"status": 200, "body": {**job, "state": "running", "elapsed_ms": 5}},
                {"status": 200, "body": {**job, "state": "done", "elapsed_ms": 10}},
            ],
            "GET /api/v1/jobs/FAKE_ASYNC/job_1/result": {
                "status": 200,
                "body": {"code": 0, "msg": "success", "data": {"images": [PNG]}},
            },
        },
    )
    assert ui["token"] == "ui-token"
    assert ui["headings"] == ["control", "fake", "diffusion"]
    rows = {r["id"]: r["text"] for r in ui["rows"]}
    assert rows["DDPM"][1] == "failed" and "crash loop" in rows["DDPM"][5]
    assert rows["FAKE_ASYNC"][2] == "yes" and rows["FAKE_ASYNC"][4] == "2"
    calls = [(c["method"], c["path"].split("?")[0]) for c in ui["calls"]]
    assert ("POST", "/api/v1/servers/gateway/restart") in calls
    assert all(c["auth"] == "Bearer ui-token" for c in ui["calls"])
    assert "hello\nworld" in ui["logs"]
    submit = next(c for c in ui["calls"] if c["path"] == "/api/v1/infer")
    assert json.loads(submit["body"])["async"] is True
    assert json.loads(submit["body"])["params"] == {"delay_ms": 10}
    assert "done" in ui["state"] and '"success"' in ui["json"]
    assert ui["outputs"] == ["img"]
    assert ui["modelOptions"] == ["FAKE_ASYNC", "DDPM"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([{"class_id": 1, "category": "car", "score": 0.9, "bbox": [1, 2, 10, 12]}],
         ["canvas:result-canvas"]),
        ({"width": 4, "height": 4, "masks": [
            {"segmentation": {"size": [4, 4], "counts": [2, 3, 11]}, "bbox": [0, 0, 2, 2]}]},
         ["canvas:result-canvas"]),
        ({"class_id": 3, "category": "3", "scores": [0.1]}, ["p:result-class"]),
    ],
)  # fmt: skip
def test_sync_results_are_drawn(tmp_path: Path, data: Any, expected: list[str]) -> None:
    """Detections become boxes and masks an overlay on the input; classes a caption."""
    ui = run_ui(
        tmp_path,
        {
            "GET /api/v1/status": {"status": 200, "body": STATUS},
            "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
            "POST /api/v1/infer": {"status": 200, "body": {"code": 0, "data": data}},
        },
        mode="sync",
    )
    submit = next(c for c in ui["calls"] if c["path"] == "/api/v1/infer")
    assert json.loads(submit["body"])["images"] == ["QUJD"]
    assert ui["outputs"] == expected and "HTTP 200" in ui["state"]
