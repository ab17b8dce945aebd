"""The supervisor's jobs routes against a real model process: listing, cancel, and a
job's events relayed live (the first event arrives while the job runs; closing the
client closes the model's stream)."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from .plane import API_TOKEN, ControlPlane, call, control_plane, wait_until

pytestmark = pytest.mark.slow


def open_events(
    plane: ControlPlane, job: str
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", plane.api_port, timeout=30)
    conn.request("GET", f"/api/v1/jobs/FAKE_ASYNC/{job}/events",
                 headers={"Authorization": f"Bearer {API_TOKEN}"})  # fmt: skip
    return conn, conn.getresponse()


def read_until(
    resp: http.client.HTTPResponse, buf: list[bytes], done: Callable[[str], bool]
) -> str:
    """Read chunks as they come (no waiting for the end) until ``done(text so far)``."""
    while not done(b"".join(buf).decode()):
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf.append(chunk)
    return b"".join(buf).decode()


def open_streams(plane: ControlPlane) -> float:
    """The model's ``mortred_job_event_streams`` gauge (its /metrics is public)."""
    _, _, body, _ = call(plane.model_ports["FAKE_ASYNC"], "GET", "/metrics", timeout=5)
    found = re.search(rb"^mortred_job_event_streams (\S+)$", body, re.M)
    assert found, "gauge missing"
    return float(found.group(1))


def test_events_stream_live_through_the_supervisor_and_cancel(tmp_path: Path) -> None:
    """A running job's events reach the client one by one before it ends; a client that
    hangs up frees the model's stream; cancel ends the job and its stream `cancelled`."""
    with control_plane(tmp_path, ["FAKE_ASYNC"]) as plane:
        plane.wait_ready(["gateway", "FAKE_ASYNC"])
        code, _, body, _ = plane.api("POST", "/api/v1/infer", body={
            "server_id": "FAKE_ASYNC", "async": True, "images": ["eA=="],
            "params": {"delay_ms": 60000, "steps": 120}})  # fmt: skip
        assert code == 202
        job = json.loads(body)["job_id"]

        conn, resp = open_events(plane, job)
        assert resp.status == 200 and resp.getheader("content-type", "").startswith(
            "text/event-stream"
        )
        buf: list[bytes] = []
        text = read_until(resp, buf, lambda t: t.count("event: progress") >= 2)
        assert "retry:" in text and "event: state" in text
        assert f'"poll_url":"/api/v1/jobs/FAKE_ASYNC/{job}"' in text
        code, _, body, _ = plane.api("GET", f"/api/v1/jobs/FAKE_ASYNC/{job}")
        assert json.loads(body)["state"] == "running"  # the events came before the end
        assert open_streams(plane) == 1
        conn.close()  # the browser leaves
        wait_until(lambda: open_streams(plane) == 0, 10, "the model's stream closed")

        code, _, body, _ = plane.api("GET", "/api/v1/jobs/FAKE_ASYNC?state=running&limit=5")
        listed = json.loads(body)["jobs"]
        assert code == 200 and [j["job_id"] for j in listed] == [job]
        assert listed[0]["poll_url"] == f"/api/v1/jobs/FAKE_ASYNC/{job}"

        conn, resp = open_events(plane, job)
        buf = []
        read_until(resp, buf, lambda t: "event: state" in t)
        code, _, body, _ = plane.api("DELETE", f"/api/v1/jobs/FAKE_ASYNC/{job}")
        assert code == 202 and json.loads(body)["cancel_requested"] is True
        text = read_until(resp, buf, lambda t: "event: cancelled" in t)
        assert "event: cancelled" in text
        assert resp.read() == b""  # the stream ends after the terminal event
        conn.close()
        code, _, _, _ = plane.api("DELETE", f"/api/v1/jobs/FAKE_ASYNC/{job}")
        assert code == 409
