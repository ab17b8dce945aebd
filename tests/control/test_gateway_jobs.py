"""The job API beyond the seed through a real gateway process, over real sockets:
cancel, listing per API key (spoofed caller headers ignored), an Idempotency-Key
retried after the client cut its connection, and a job's events read as they arrive
(a client that leaves releases the model's stream).

One control plane with ``FAKE_ASYNC`` and three API keys: ``alice`` and ``bob``
(scope ``inference``) and ``ops`` (scope ``all``); ``carol`` only submits with an
Idempotency-Key, so her listing counts exactly her jobs.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.gateway.apikeys import hash_key

from .plane import ControlPlane, call, control_plane, wait_until

pytestmark = pytest.mark.slow

MODEL = "FAKE_ASYNC"
JOBS = f"/v1/models/{MODEL}/jobs"
#: 60 s in 120 steps: progress every 0.5 s, and far from ending on its own.
LONG = {"images": ["aGk="], "params": {"delay_ms": 60000, "steps": 120}}
KEYS = {"alice": "inference", "bob": "inference", "ops": "all", "carol": "inference"}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp: Path = tmp_path_factory.mktemp("gwjobs")
    (tmp / "api_keys.toml").write_text(
        "".join(
            f'[[keys]]\nname = "{name}"\nsha256 = "{hash_key(name + "-key")}"\nscope = "{scope}"\n'
            for name, scope in KEYS.items()
        )
    )
    with control_plane(tmp, [MODEL], env={"MORTRED_METRICS_TOKEN": "metrics"}) as cp:
        cp.wait_ready(["gateway", MODEL])
        yield cp


def gw(plane: ControlPlane, who: str, method: str, path: str, **kw: Any) -> tuple[int, Any, Any]:
    """``(status, headers, JSON body)`` of one request with ``who``'s API key."""
    code, headers, body, _ = plane.gw(method, path, token=f"{who}-key", **kw)
    return code, headers, json.loads(body) if body else None


def submit(plane: ControlPlane, who: str, body: dict[str, Any] = LONG) -> str:
    code, _, doc = gw(plane, who, "POST", JOBS, body=body)
    assert code == 202, doc
    return str(doc["job_id"])


def running(plane: ControlPlane, job: str) -> bool:
    return gw(plane, "ops", "GET", f"{JOBS}/{job}")[2]["state"] == "running"


def cancel_all(plane: ControlPlane, *jobs: str) -> None:
    """Cancel each job and wait until it has ended (a running one stops at its next
    step, after the 202)."""
    for job in jobs:
        gw(plane, "ops", "DELETE", f"{JOBS}/{job}")
    for job in jobs:
        code, _, doc = gw(plane, "ops", "GET", f"{JOBS}/{job}/wait?timeout=30000")
        assert code == 200 and doc["state"] == "cancelled", doc


def metric(plane: ControlPlane, name: str) -> float:
    _, _, body, _ = plane.gw("GET", "/metrics", token="metrics")
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def model_streams(plane: ControlPlane) -> float:
    """The model's ``mortred_job_event_streams`` gauge (its /metrics is public)."""
    _, _, body, _ = call(plane.model_ports[MODEL], "GET", "/metrics", timeout=5)
    found = re.search(rb"^mortred_job_event_streams (\S+)$", body, re.M)
    assert found, "gauge missing"
    return float(found.group(1))


def test_cancel_through_the_gateway(plane: ControlPlane) -> None:
    """A pending job cancelled through the gateway ends at once (200); a running one
    is asked to stop (202) and ends cancelled; cancelling it again is 409."""
    first, second = submit(plane, "alice"), submit(plane, "alice")  # both workers busy
    third = submit(plane, "alice")
    wait_until(lambda: running(plane, first) and running(plane, second), 30, "two running")
    code, _, doc = gw(plane, "alice", "DELETE", f"{JOBS}/{third}")
    assert code == 200 and doc["state"] == "cancelled", doc
    assert doc["poll_url"] == f"{JOBS}/{third}"
    code, _, doc = gw(plane, "alice", "DELETE", f"{JOBS}/{first}")
    assert code == 202 and doc["cancel_requested"] is True, doc
    code, _, doc = gw(plane, "alice", "GET", f"{JOBS}/{first}/wait?timeout=30000")
    assert code == 200 and doc["state"] == "cancelled", doc
    code, _, doc = gw(plane, "alice", "DELETE", f"{JOBS}/{first}")
    assert code == 409 and "cancelled" in doc["error"]
    assert gw(plane, "alice", "DELETE", f"{JOBS}/job_00000000000000000000dead")[0] == 404
    cancel_all(plane, second)


def test_each_api_key_lists_its_own_jobs(plane: ControlPlane) -> None:
    """alice and bob each list only the jobs they submitted; an `all` key lists both;
    alice's forged X-Mortred-Principal headers change nothing."""
    a, b = submit(plane, "alice"), submit(plane, "bob")
    cancel_all(plane, a, b)

    def listed(who: str, headers: dict[str, str] | None = None) -> list[str]:
        code, _, doc = gw(plane, who, "GET", f"{JOBS}?limit=500", headers=headers)
        assert code == 200, doc
        assert all(j["poll_url"] == f"{JOBS}/{j['job_id']}" for j in doc["jobs"])
        return [j["job_id"] for j in doc["jobs"]]

    alice, bob, ops = listed("alice"), listed("bob"), listed("ops")
    assert a in alice and b not in alice
    assert b in bob and a not in bob
    assert {a, b} <= set(ops)
    forged = {"X-Mortred-Principal": "key:bob", "X-Mortred-Principal-Scope": "all"}
    assert listed("alice", forged) == listed("alice")
    code, _, doc = gw(plane, "bob", "GET", f"{JOBS}?state=cancelled&limit=1")
    assert code == 200 and [j["job_id"] for j in doc["jobs"]] == [b]


def test_another_keys_job_is_404_on_every_job_route(plane: ControlPlane) -> None:
    """Through the gateway, bob gets 404 for alice's job on status, wait, result,
    events and cancel (as for an unknown id), and his DELETE leaves it running; alice
    and an `all` key still see it."""
    a = submit(plane, "alice")
    try:
        for method, path in (
            ("GET", f"{JOBS}/{a}"),
            ("GET", f"{JOBS}/{a}/wait?timeout=0"),
            ("GET", f"{JOBS}/{a}/result"),
            ("GET", f"{JOBS}/{a}/events"),
            ("DELETE", f"{JOBS}/{a}"),
        ):
            code, _, doc = gw(plane, "bob", method, path)
            assert code == 404 and "not found" in doc["error"], (method, path, doc)
        code, _, doc = gw(plane, "alice", "GET", f"{JOBS}/{a}")
        assert (
            code == 200
            and doc["state"] in ("pending", "running")
            and not doc.get("cancel_requested")
        ), doc
        assert gw(plane, "ops", "GET", f"{JOBS}/{a}")[0] == 200
    finally:
        cancel_all(plane, a)


def test_idempotent_submit_retried_after_the_client_cut_its_connection(
    plane: ControlPlane,
) -> None:
    """A client sends a submit with an Idempotency-Key and hangs up before reading the
    202; its retry gets the same job, marked replayed; one job exists for the key."""
    body = json.dumps(LONG).encode()
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=30) as s:
        s.sendall(
            f"POST {JOBS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer carol-key\r\n"
            "Idempotency-Key: order-42\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # The job exists (carol lists it) while the 202 is still unread.
        (job,) = wait_until(
            lambda: [j["job_id"] for j in gw(plane, "carol", "GET", JOBS)[2]["jobs"]],
            30,
            "admitted",
        )
    code, headers, doc = gw(plane, "carol", "POST", JOBS, body=LONG,
                            headers={"Idempotency-Key": "order-42"})  # fmt: skip
    assert code == 202 and doc["job_id"] == job, doc
    assert headers["idempotent-replayed"] == "true"
    assert doc["poll_url"] == f"{JOBS}/{job}"
    assert [j["job_id"] for j in gw(plane, "carol", "GET", JOBS)[2]["jobs"]] == [job]
    other = dict(LONG, params={"delay_ms": 1})
    code, _, doc = gw(plane, "carol", "POST", JOBS, body=other,
                      headers={"Idempotency-Key": "order-42"})  # fmt: skip
    assert code == 422 and "Idempotency-Key" in doc["error"], doc
    code, headers, doc = gw(plane, "alice", "POST", JOBS, body=LONG,
                            headers={"Idempotency-Key": "order-42"})  # fmt: skip
    assert code == 202 and doc["job_id"] != job and "idempotent-replayed" not in headers
    cancel_all(plane, job, doc["job_id"])


def open_events(plane: ControlPlane, job: str, who: str = "alice") -> tuple[Any, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", plane.gw_port, timeout=30)
    conn.request("GET", f"{JOBS}/{job}/events", headers={"Authorization": f"Bearer {who}-key"})
    return conn, conn.getresponse()


def read_until(resp: Any, buf: list[bytes], done: Callable[[str], bool]) -> str:
    """Read what has arrived (never waiting for the end) until ``done(text so far)``."""
    while not done(b"".join(buf).decode()):
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf.append(chunk)
    return b"".join(buf).decode()


def test_events_arrive_live_and_a_client_that_leaves_frees_the_models_stream(
    plane: ControlPlane,
) -> None:
    """A running job's events reach a real client one by one while it runs, with
    gateway URLs; hanging up frees the model's stream and the gateway's forward; a
    second stream ends with the cancelled event, then closes."""
    job = submit(plane, "alice")
    conn, resp = open_events(plane, job)
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    assert resp.getheader("transfer-encoding") == "chunked"
    buf: list[bytes] = []
    text = read_until(resp, buf, lambda t: t.count("event: progress") >= 2)
    assert "retry:" in text and "event: state" in text
    assert f'"poll_url":"{JOBS}/{job}"' in text
    assert running(plane, job)  # the events came before the end
    assert model_streams(plane) == 1
    conn.close()  # the client leaves mid-stream
    wait_until(lambda: model_streams(plane) == 0, 30, "the model's stream closed")
    wait_until(lambda: metric(plane, "mortred_gateway_inflight_requests") == 0, 30, "forward ended")

    conn, resp = open_events(plane, job)
    buf = []
    read_until(resp, buf, lambda t: "event: state" in t)
    assert gw(plane, "alice", "DELETE", f"{JOBS}/{job}")[0] == 202
    text = read_until(resp, buf, lambda t: "event: cancelled" in t)
    assert "event: cancelled" in text
    assert resp.read() == b""  # the stream ends after the terminal event
    conn.close()
    wait_until(lambda: model_streams(plane) == 0, 30, "no stream left")


def test_a_short_jobs_stream_ends_with_done(plane: ControlPlane) -> None:
    """A job that runs to its end: the stream gives its state, then `done`, then ends."""
    job = submit(plane, "bob", {"images": ["aGk="], "params": {"delay_ms": 600, "steps": 3}})
    conn, resp = open_events(plane, job, "bob")
    buf: list[bytes] = []
    text = read_until(resp, buf, lambda t: "event: done" in t)
    assert text.index("event: state") < text.index("event: done")
    assert resp.read() == b""
    conn.close()
