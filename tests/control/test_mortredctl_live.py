"""mortredctl against a real control plane: status, jobs through both paths, restart."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mortred_twisted.cli.mortredctl import main

from .plane import API_TOKEN, GW_TOKEN, ControlPlane, control_plane

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
