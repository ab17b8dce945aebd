"""The internal token goes only to trusted children (supervisor/trust.py): the gate,
the supervisor's own view, and the gateway's view read from the supervisor, with a
real process watched through its pidfd."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_twisted import ensureDeferred
from twisted.internet import defer, reactor
from twisted.internet.task import Clock, deferLater

from mortred_twisted.http11.upstream import UpstreamUnavailable
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.monitor import ManagedServer, Supervisor, Timing
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.process import ProcessSpec
from mortred_twisted.supervisor.replicas import ReplicaGroup
from mortred_twisted.supervisor.trust import (
    LocalChildren,
    RemoteChildren,
    TrustGate,
    children_document,
    origin_of,
)

from .fakes import FakeProber, FakeSpawner


@dataclass
class Recorder:
    """An upstream client that records what it was asked to send."""

    sent: list[tuple[str, str, dict[bytes, list[bytes]]]] = field(default_factory=list)
    replies: dict[str, Any] = field(default_factory=dict)

    def request(self, method: str, url: str, headers: Any, body: Any = None) -> Any:
        self.sent.append((method, url, headers))
        reply = self.replies.get(url)
        if isinstance(reply, defer.Deferred):
            return reply
        if isinstance(reply, Exception):
            return defer.fail(reply)
        return defer.succeed(reply or Reply(200, b"{}"))

    def stream(self, method: str, url: str, headers: Any) -> Any:
        self.sent.append((method, url, headers))
        return defer.succeed("stream")

    def body_for(self, content: Any, length: int) -> bytes:
        return b"body"


@dataclass
class Reply:
    code: int
    body: bytes


def outcome(d: defer.Deferred[Any]) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    return out[0] if out else None


def model(sid: str, clock: Clock, sp: FakeSpawner, pr: FakeProber, port: int) -> ManagedServer:
    return ManagedServer(
        sid,
        kind="model",
        spec=ProcessSpec((sid,)),
        probe_url=f"http://127.0.0.1:{port}/ready",
        tracker=RestartTracker("no"),
        clock=clock,
        spawner=sp,
        prober=pr,
        log_buffer=LogBuffer(),
        timing=Timing(probe_interval=0.5, ready_timeout=10, grace=3),
        verify_identity=True,
    )


def test_origin_of() -> None:
    assert origin_of("http://127.0.0.1:18121/jobs/x?y=/z") == "http://127.0.0.1:18121"
    assert origin_of("http://[::1]:5/") == "http://[::1]:5"
    assert origin_of("http://h:1") == "http://h:1"


def test_the_supervisors_relay_sends_only_to_a_proven_ready_child() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    a = model("A@1", clock, sp, pr, 18121)
    b = model("A@2", clock, sp, pr, 18122)
    sup = Supervisor([ReplicaGroup("A", [a, b])])
    rec = Recorder()
    gate = TrustGate(rec, LocalChildren(sup.model_children()))
    url = "http://127.0.0.1:18121/jobs/job_1"
    refused = outcome(gate.request("GET", url, {b"authorization": [b"Bearer t"]}))
    assert refused.check(UpstreamUnavailable) and "not ready (stopped)" in str(refused.value)
    assert rec.sent == []
    a.start()
    pr.ready["http://127.0.0.1:18121/ready"] = True
    clock.advance(0.5)  # probed with the spawn key: the fake prober's True is the proof
    assert a.ready and a.verified and a.trusted
    assert outcome(gate.request("GET", url, {})).code == 200
    assert outcome(gate.stream("GET", url + "/events", {})) == "stream"
    assert [u for _, u, _ in rec.sent] == [url, url + "/events"]
    assert gate.body_for(None, 0) == b"body"  # everything else is the client's
    # Its process ends: nothing more is sent there, even before any probe.
    sp.children[0].exit(signal=9)
    assert not a.trusted
    assert outcome(gate.request("GET", url, {})).check(UpstreamUnavailable)
    assert len(rec.sent) == 2
    # Not a supervised child (a remote upstream): passes.
    assert outcome(gate.request("GET", "http://10.0.0.9:80/x", {})).code == 200
    doc = children_document(sup.model_children())["children"]
    assert [(c["id"], c["url"], c["trusted"]) for c in doc] == [
        ("A@1", "http://127.0.0.1:18121", False),
        ("A@2", "http://127.0.0.1:18122", False),
    ]


def _doc(*children: dict[str, Any]) -> Reply:
    return Reply(200, json.dumps({"children": list(children)}).encode())


def _child(url: str, pid: int | None, trusted: bool, state: str = "running") -> dict[str, Any]:
    return {"id": "A@1", "url": url, "pid": pid, "state": state, "ready": trusted,
            "verified": trusted, "trusted": trusted}  # fmt: skip


SUP = "http://127.0.0.1:8787"
CHILDREN = SUP + "/api/v1/children"
URL = "http://127.0.0.1:18121"


@ensureDeferred
async def test_the_gateway_trusts_what_the_supervisor_reports_and_no_more() -> None:
    rec = Recorder()
    view = RemoteChildren(rec, SUP, "internal", reactor)
    gate = TrustGate(rec, view)
    # Before any reading: nothing supervised is trusted; a miss reads at once.
    rec.replies[CHILDREN] = _doc(_child(URL, None, False, "starting"))
    with pytest.raises(UpstreamUnavailable, match=r"not ready \(starting\)"):
        await gate.request("POST", URL + "/jobs", {})
    assert [u for _, u, _ in rec.sent] == [CHILDREN]
    assert rec.sent[0][2][b"authorization"] == [b"Bearer internal"]  # to the supervisor
    # A trusted child whose process is alive: sent (a real pid: this test's own).
    import os

    rec.replies[CHILDREN] = _doc(_child(URL, os.getpid(), True))
    reply = await gate.request("POST", URL + "/jobs", {})
    assert reply.code == 200 and rec.sent[-1][1] == URL + "/jobs"
    view.stop()


@ensureDeferred
async def test_a_trusted_childs_exit_withdraws_trust_before_anything_is_sent() -> None:
    """The pidfd of a trusted child: its exit is seen at the next request, and that
    request reads the supervisor again instead of sending to the port."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rec = Recorder()
    view = RemoteChildren(rec, SUP, "internal", reactor)
    gate = TrustGate(rec, view)
    try:
        rec.replies[CHILDREN] = _doc(_child(URL, proc.pid, True))
        await view.refresh()
        assert view.verdict(URL).ok  # type: ignore[union-attr]
        proc.kill()
        proc.wait(10)
        # Without a reactor turn (a request read in the same turn as the pidfd's
        # readiness): the kernel is asked at once.
        verdict = view.verdict(URL)
        assert verdict is not None and not verdict.ok and verdict.reason == "exited"
        rec.sent.clear()
        rec.replies[CHILDREN] = _doc(_child(URL, None, False, "backoff"))
        with pytest.raises(UpstreamUnavailable, match=r"backoff"):
            await gate.request("GET", URL + "/jobs/j", {})
        assert [u for _, u, _ in rec.sent] == [CHILDREN]  # only the supervisor was asked
    finally:
        view.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@ensureDeferred
async def test_an_unreachable_supervisor_means_no_child_is_trusted() -> None:
    rec = Recorder()
    view = RemoteChildren(rec, SUP, "internal", reactor)
    gate = TrustGate(rec, view)
    rec.replies[CHILDREN] = ConnectionRefusedError("refused")
    with pytest.raises(UpstreamUnavailable, match="supervisor not reachable"):
        await gate.request("GET", URL + "/jobs/j", {})
    # Even an origin it never named is refused while nothing could be read.
    with pytest.raises(UpstreamUnavailable):
        await gate.request("GET", "http://127.0.0.1:9/x", {})
    assert all(u == CHILDREN for _, u, _ in rec.sent)
    view.stop()


@ensureDeferred
async def test_concurrent_misses_share_one_reading() -> None:
    rec = Recorder()
    view = RemoteChildren(rec, SUP, "internal", reactor)
    gate = TrustGate(rec, view)
    pending: defer.Deferred[Any] = defer.Deferred()
    rec.replies[CHILDREN] = pending
    first = gate.request("GET", URL + "/a", {})
    second = gate.request("GET", URL + "/b", {})
    await deferLater(reactor, 0, lambda: None)  # the reading starts at the turn's end
    assert len(rec.sent) == 1
    third = gate.request("GET", URL + "/c", {})  # a miss while it runs: the next one
    import os

    pending.callback(_doc(_child(URL, os.getpid(), True)))
    assert (await first).code == 200 and (await second).code == 200
    assert [u for _, u, _ in rec.sent] == [CHILDREN, URL + "/a", URL + "/b"]
    rec.replies[CHILDREN] = _doc(_child(URL, os.getpid(), True))
    assert (await third).code == 200  # after a reading that started after it
    assert [u for _, u, _ in rec.sent][3:] == [CHILDREN, URL + "/c"]
    view.stop()
