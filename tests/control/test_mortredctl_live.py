"""mortredctl against a real control plane: status, jobs through both paths (submit,
list, watch, cancel through the gateway), restart."""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mortred_twisted.cli.mortredctl import main

from .plane import API_TOKEN, GW_TOKEN, ControlPlane, call, control_plane, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane(tmp_path_factory.mktemp("ctl"), ["FAKE_ASYNC"]) as cp:
        cp.wait_ready(["gateway", "FAKE_ASYNC"])
        yield cp


def ctl(plane: ControlPlane, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    base = [
        *("--addr", f"http://127.0.0.1:{plane.api_port}", "--token", API_TOKEN),
        *("--gateway", f"http://127.0.0.1:{plane.gw_port}", "--gateway-token", GW_TOKEN),
    ]
    return main([*base, *argv], out=out), out.getvalue()


def test_status_and_catalog(plane: ControlPlane) -> None:
    """status shows the running model; catalog lists it as async."""
    code, text = ctl(plane, "status")
    assert code == 0 and "FAKE_ASYNC" in text and "running" in text
    code, text = ctl(plane, "catalog")
    assert code == 0 and "FAKE_ASYNC" in text and "async" in text


def test_job_through_gateway_and_result(plane: ControlPlane, tmp_path: Path) -> None:
    """jobs submit --wait through the gateway ends done; jobs result prints the envelope."""
    img = tmp_path / "in.png"
    img.write_bytes(b"not really a png")
    code, text = ctl(plane, "jobs", "submit", "FAKE_ASYNC", "--image", str(img),
                     "--params", '{"delay_ms": 300}', "--wait", "-q")  # fmt: skip
    assert code == 0
    submitted, _, final = text.partition("}\n")
    doc = json.loads(submitted + "}")
    assert doc["poll_url"].startswith("/v1/models/FAKE_ASYNC/jobs/")
    assert json.loads(final)["state"] == "done"
    code, text = ctl(plane, "jobs", "result", doc["result_url"])
    assert code == 0 and json.loads(text)["code"] == 0


def model_streams(plane: ControlPlane) -> float:
    """The model's ``mortred_job_event_streams`` gauge (its /metrics is public)."""
    _, _, body, _ = call(plane.model_ports["FAKE_ASYNC"], "GET", "/metrics", timeout=5)
    found = re.search(rb"^mortred_job_event_streams (\S+)$", body, re.M)
    return float(found.group(1)) if found else -1.0


def test_jobs_list_watch_and_cancel_through_the_gateway(plane: ControlPlane) -> None:
    """jobs list shows a running job; jobs watch follows its live events through the
    gateway until jobs cancel ends it, then prints the cancelled status and fails."""
    code, text = ctl(plane, "jobs", "submit", "FAKE_ASYNC",
                     "--params", '{"delay_ms": 60000, "steps": 120}')  # fmt: skip
    assert code == 0
    url = json.loads(text)["poll_url"]
    job = url.rsplit("/", 1)[1]
    wait_until(lambda: job in ctl(plane, "jobs", "list", "FAKE_ASYNC", "--state", "running")[1],
               30, "listed as running")  # fmt: skip
    code, text = ctl(plane, "--json", "jobs", "list", "FAKE_ASYNC", "--limit", "1")
    assert code == 0 and json.loads(text)["jobs"][0]["poll_url"] == url
    watched: list[tuple[int, str]] = []
    watcher = threading.Thread(
        target=lambda: watched.append(ctl(plane, "jobs", "watch", url, "-q"))
    )
    watcher.start()
    wait_until(lambda: model_streams(plane) == 1, 30, "watch following the model's stream")
    code, text = ctl(plane, "jobs", "cancel", job, "--model", "FAKE_ASYNC")
    assert code == 0 and text == f"{job}: cancel requested (running)\n"
    watcher.join(60)
    ((code, text),) = watched
    assert code != 0 and json.loads(text)["state"] == "cancelled"
    code, text = ctl(plane, "jobs", "cancel", url)
    assert code != 0  # already finished: 409


def test_infer_via_supervisor_proxy(plane: ControlPlane) -> None:
    """Without --gateway, infer goes through the supervisor's try-it proxy."""
    out = io.StringIO()
    code = main(["--addr", f"http://127.0.0.1:{plane.api_port}", "--token", API_TOKEN,
                 "infer", "FAKE_ASYNC", "--params", '{"delay_ms": 10}'], out=out)  # fmt: skip
    assert code == 0 and json.loads(out.getvalue())["msg"] == "success"


def test_restart_wait_and_logs(plane: ControlPlane) -> None:
    """restart --wait returns once a new process is ready; logs show the restart."""
    old = plane.status()["FAKE_ASYNC"]["pid"]
    code, _ = ctl(plane, "restart", "FAKE_ASYNC", "--wait", "--wait-timeout", "60")
    assert code == 0 and plane.status()["FAKE_ASYNC"]["pid"] != old
    code, text = ctl(plane, "logs", "FAKE_ASYNC", "--limit", "1000")
    assert code == 0 and f"stopping pid {old}" in text


def sup_ctl(plane: ControlPlane, *argv: str) -> tuple[int, str]:
    """mortredctl without --gateway: jobs go through the supervisor's proxy."""
    out = io.StringIO()
    base = ["--addr", f"http://127.0.0.1:{plane.api_port}", "--token", API_TOKEN]
    return main([*base, *argv], out=out), out.getvalue()


def test_jobs_through_the_supervisor_proxy(plane: ControlPlane) -> None:
    """Without --gateway, jobs submit --wait, get, result and list --all use the
    supervisor's /api/v1/jobs/<id>/ URLs."""
    code, text = sup_ctl(plane, "jobs", "submit", "FAKE_ASYNC", "--params",
                         '{"delay_ms": 100}', "--wait", "-q")  # fmt: skip
    assert code == 0
    submitted, _, final = text.partition("}\n")
    doc = json.loads(submitted + "}")
    assert doc["poll_url"].startswith("/api/v1/jobs/FAKE_ASYNC/job_")
    assert json.loads(final)["state"] == "done"
    code, text = sup_ctl(plane, "jobs", "get", doc["job_id"], "--model", "FAKE_ASYNC")
    assert code == 0 and json.loads(text)["state"] == "done"
    code, text = sup_ctl(plane, "jobs", "result", doc["poll_url"])
    assert code == 0 and json.loads(text)["code"] == 0
    code, text = sup_ctl(plane, "--json", "jobs", "list", "FAKE_ASYNC", "--all", "--limit", "1")
    assert code == 0 and doc["job_id"] in [j["job_id"] for j in json.loads(text)["jobs"]]
