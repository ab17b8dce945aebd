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


# -- jobs page --------------------------------------------------------------------------------

NASTY = '<img src=x onerror="alert(1)">&amp;'
JOB_A = {
    "job_id": "job_a",
    "state": "running",
    "elapsed_ms": 1200,
    "progress": {"step": 1, "total": 10},
    "poll_url": "/api/v1/jobs/FAKE_ASYNC/job_a",
}
JOB_B = {"job_id": "job_b", "state": "pending", "elapsed_ms": 30, "queue_position": 2}
JOB_C = {"job_id": "job_c", "state": "failed", "elapsed_ms": 5, "error": NASTY}
JOB_N = {"job_id": "job_n", "state": "pending", "elapsed_ms": 0,
         "poll_url": "/api/v1/jobs/FAKE_ASYNC/job_n",
         "result_url": "/api/v1/jobs/FAKE_ASYNC/job_n/result"}  # fmt: skip


def event(name: str, doc: dict[str, Any], seq: int, eol: str = "\n") -> str:
    return f"id: {seq}{eol}event: {name}{eol}data: {json.dumps(doc)}{eol}{eol}"


def test_jobs_page_lists_follows_cancels_submits_and_shows_the_result(tmp_path: Path) -> None:
    """The jobs page lists a model's jobs, moves a bar from the event stream, cancels a
    pending job, and shows a finished job's images; server text stays text."""
    progress = {**JOB_A, "progress": {"step": 5, "total": 10}}
    ui = run_ui(
        tmp_path,
        {
            "GET /api/v1/status": {"status": 200, "body": STATUS},
            "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
            "GET /api/v1/jobs/FAKE_ASYNC": {
                "status": 200,
                "body": {"jobs": [JOB_A, JOB_B, JOB_C], "next_cursor": None},
            },
            "GET /api/v1/queue/FAKE_ASYNC": {"status": 200, "body": {
                "depth": 2, "pending": 1, "running": 1, "oldest_wait_ms": 1500,
                "max_queue": 8, "callers": [
                    {"caller": "key:a<b>", "pending": 1, "running": 0,
                     "oldest_wait_ms": 1500, "max_pending": 4},
                    {"caller": "", "pending": 0, "running": 1, "oldest_wait_ms": 0,
                     "max_pending": 0}]}},
            # Records split anywhere, CRLF endings, a heartbeat comment.
            "GET /api/v1/jobs/FAKE_ASYNC/job_a/events": {"status": 200, "sse": [
                "retry: 2000\n\n" + event("state", JOB_A, 1)[:20],
                event("state", JOB_A, 1)[20:] + event("progress", progress, 2, "\r\n")[:-1],
                "\n: ping\n\n",
            ]},
            "GET /api/v1/jobs/FAKE_ASYNC/job_b/events": {"status": 200, "sse": [
                event("state", JOB_B, 1)]},
            "DELETE /api/v1/jobs/FAKE_ASYNC/job_b": {"status": 200, "body": {
                **JOB_B, "state": "cancelled", "error": "cancelled by request"}},
            "POST /api/v1/infer": {"status": 202, "body": JOB_N},
            "GET /api/v1/jobs/FAKE_ASYNC/job_n/events": {"status": 200, "sse": [
                event("state", {**JOB_N, "state": "running"}, 1),
                event("done", {**JOB_N, "state": "done", "progress": {"step": 4, "total": 4}}, 2),
            ]},
            "GET /api/v1/jobs/FAKE_ASYNC/job_n/result": {"status": 200, "body": {
                "code": 0, "msg": "success",
                "data": {"images": [PNG, "not base64 <b>"], "overlay": PNG, "note": NASTY}}},
        },
        mode="jobs",
    )  # fmt: skip
    assert ui["modelOptions"] == ["FAKE_ASYNC", "DDPM"]
    listed = {r["id"]: r for r in ui["listed"]}
    assert list(listed) == ["job_a", "job_b", "job_c"]  # newest first, as listed
    a = listed["job_a"]
    assert a["events"] == 2 and a["bar"] == {"value": "5", "max": "10"} and "5/10" in a["text"][2]
    assert a["text"][1] == "running" and a["text"][4] == "1.2 s" and not a["cancelDisabled"]
    assert listed["job_b"]["text"][3] == "2" and listed["job_b"]["bar"]["value"] == "0"
    c = listed["job_c"]
    assert c["text"][1] == "failed" + NASTY and "img" not in c["tags"] and c["cancelDisabled"]
    b_after = next(r for r in ui["afterCancel"] if r["id"] == "job_b")
    assert b_after["text"][1].startswith("cancelled") and b_after["cancelDisabled"]
    # Streams and every API call carry the token in the header, never in the URL.
    streams = [c for c in ui["calls"] if c["path"].endswith("/events")]
    assert {c["path"] for c in streams} >= {"/api/v1/jobs/FAKE_ASYNC/job_a/events"}
    assert all(c["accept"] == "text/event-stream" for c in streams)
    assert all(c["auth"] == "Bearer ui-token" and "token" not in c["path"] for c in ui["calls"])
    assert ("DELETE", "/api/v1/jobs/FAKE_ASYNC/job_b") in [
        (c["method"], c["path"]) for c in ui["calls"]
    ]
    submit = json.loads(next(c for c in ui["calls"] if c["path"] == "/api/v1/infer")["body"])
    assert submit["async"] is True and submit["server_id"] == "FAKE_ASYNC"
    assert submit["params"] == {"delay_ms": 10}
    n = next(r for r in ui["final"] if r["id"] == "job_n")
    assert (
        n["text"][1] == "done"
        and n["bar"] == {"value": "4", "max": "4"}
        and not n["resultDisabled"]
    )
    # The finished job's result: both valid PNGs shown, the bad string skipped.
    assert ui["outputs"] == ["img:data:image/png;base64," + PNG] * 2
    assert "job_n: HTTP 200" in ui["title"] and '"note": "<img src=x' in ui["json"]
    # The model's queue above the list, per caller, as text.
    assert ui["queue"].startswith("queue 2/8: 1 waiting, 1 running, oldest wait 1.5 s")
    assert "key:a<b> 1 waiting + 0 running (max 4); (port) 0 waiting + 1 running" in ui["queue"]


SSE_INPUT = (
    "\ufeffretry: 1500\n\n"
    ": ping\n\n"
    'id: 1\nevent: state\ndata: {"a": 1}\n\n'
    "id: 2\r\nevent: progress\r\ndata: line one\r\ndata: line two\r\n\r\n"
    "event: ignored-without-data\n\n"
    "data:no space\rid\r\r"
    'id: 3\nevent: done\ndata: {"b": "x: y"}\n\n'
    "data: incomplete at the end"
)


def test_sse_parser_handles_every_split(tmp_path: Path) -> None:
    """The page's SSE parser gives the same events however the stream is chunked."""
    scripted = {"sse_input": SSE_INPUT, "results": [
        {"images": [PNG, PNG]},
        {"results": [{"overlay": PNG,
                      "masks": [{"segmentation": PNG}, {"segmentation": {"counts": []}}]}]},
        {"images": 3, "digest": "abc"},
        {"predicted_x0": [{"images": [PNG]}], "images": ["<svg onload=x>"]},
        [{"bbox": [0, 0, 1, 1]}],
    ]}  # fmt: skip
    ui = run_ui(tmp_path, scripted, mode="sse")
    expected = [
        {"event": "state", "data": '{"a": 1}', "id": "1"},
        {"event": "progress", "data": "line one\nline two", "id": "2"},
        {"event": "message", "data": "no space", "id": ""},
        {"event": "done", "data": '{"b": "x: y"}', "id": "3"},
    ]
    assert ui["whole"] == expected
    assert all(split == expected for split in ui["splits"])
    assert ui["chars"] == expected
    assert ui["images"] == [2, 2, 0, 1, 0]
