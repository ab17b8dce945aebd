"""Cancel, listing and live events through the gateway when two replicas share one
id's jobs in a real redis-server: whichever replica the gateway picks answers for a
job running on the other, and with one replica stopped the gateway moves the
request to the other one."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.gateway.apikeys import hash_key
from tests.e2e.test_fleet import MODEL, fleet
from tests.support.redis_server import RedisServer, redis_server

from .plane import ControlPlane, call, wait_until

pytestmark = pytest.mark.slow

JOBS = f"/v1/models/{MODEL}/jobs"


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def gw(plane: ControlPlane, who: str, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    code, _, body, _ = plane.gw(method, path, token=f"{who}-key", **kw)
    return code, json.loads(body) if body else None


def gauge(port: int, name: str) -> float:
    _, _, body, _ = call(port, "GET", "/metrics", timeout=5)
    found = re.search(rb"^" + name.encode() + rb" (\S+)$", body, re.M)
    return float(found.group(1)) if found else 0.0


def events_until_progress(plane: ControlPlane, job: str) -> str:
    """Open the job's events through the gateway and read until a progress event."""
    conn = http.client.HTTPConnection("127.0.0.1", plane.gw_port, timeout=30)
    try:
        conn.request("GET", f"{JOBS}/{job}/events", headers={"Authorization": "Bearer alice-key"})
        resp = conn.getresponse()
        assert resp.status == 200
        text = ""
        while "event: progress" not in text:
            chunk = resp.read1(65536)
            assert chunk, text
            text += chunk.decode()
        return text
    finally:
        conn.close()


def test_job_routes_answer_from_either_replica(tmp_path: Path, redis: RedisServer) -> None:
    """Events (with progress) and listings from both replicas for a job running on one;
    with the other replica stopped, cancel and listing still answer (refused
    connections go to the running replica) and the job ends cancelled."""
    (tmp_path / "api_keys.toml").write_text(
        "".join(
            f'[[keys]]\nname = "{n}"\nsha256 = "{hash_key(n + "-key")}"\n' for n in ("alice", "bob")
        )
    )
    with fleet(tmp_path, redis) as (plane, port):
        plane.wait_ready(["gateway", MODEL])
        wait_until(lambda: plane.status()[MODEL]["ready_replicas"] == 2, 60, "both replicas")
        body = {"images": ["aGk="], "params": {"delay_ms": 60000, "steps": 120}}
        code, doc = gw(plane, "alice", "POST", JOBS, body=body)
        assert code == 202, doc
        job = doc["job_id"]
        wait_until(lambda: gw(plane, "alice", "GET", f"{JOBS}/{job}")[1]["state"] == "running",
                   30, "running")  # fmt: skip
        streams = "mortred_job_event_streams"
        for _ in range(2):  # round robin: one stream from each replica
            assert f'"poll_url":"{JOBS}/{job}"' in events_until_progress(plane, job)
        wait_until(lambda: gauge(port, streams) + gauge(port + 1, streams) == 0, 30, "closed")
        for _ in range(2):
            assert job in [j["job_id"] for j in gw(plane, "alice", "GET", JOBS)[1]["jobs"]]
            assert job not in [j["job_id"] for j in gw(plane, "bob", "GET", JOBS)[1]["jobs"]]

        busy = "mortred_workers_busy"
        busy_port = port if gauge(port, busy) == 1 else port + 1
        idle_id = f"{MODEL}@{2 if busy_port == port else 1}"  # @1 listens on port
        assert plane.api("POST", f"/api/v1/servers/{idle_id}/stop")[0] == 202
        wait_until(lambda: plane.status()[MODEL]["ready_replicas"] == 1, 30, "one replica")
        assert gauge(busy_port, busy) == 1  # the job's replica is the one left
        codes = [gw(plane, "alice", "DELETE", f"{JOBS}/{job}")[0] for _ in range(2)]
        assert codes[0] == 202 and codes[1] in (202, 409), codes
        for _ in range(2):
            assert job in [j["job_id"] for j in gw(plane, "alice", "GET", JOBS)[1]["jobs"]]
        code, doc = gw(plane, "alice", "GET", f"{JOBS}/{job}/wait?timeout=30000")
        assert code == 200 and doc["state"] == "cancelled", doc
