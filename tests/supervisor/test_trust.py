"""Issue 40 in the supervisor's core: a held port is a failed start, readiness proves
identity, leftovers are told apart from strangers (task.Clock + fakes; real sockets
and a real HTTP server where the subject is the socket or the wire)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from pytest_twisted import ensureDeferred
from treq.client import HTTPClient
from twisted.internet import defer, reactor
from twisted.internet.task import Clock
from twisted.web import resource, server
from twisted.web.client import Agent, HTTPConnectionPool

from mortred_twisted.supervisor.child_contract import (
    CHALLENGE_HEADER,
    EXIT_CANNOT_LISTEN,
    MAX_CHALLENGE,
    PROOF_HEADER,
    SPAWN_KEY_ENV,
    answer_challenge,
    new_challenge,
    new_spawn_key,
    proof,
    proves,
)
from mortred_twisted.supervisor.leftovers import classify, stop_leftovers
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.monitor import (
    Impostor,
    ManagedServer,
    Supervisor,
    Timing,
    http_prober,
)
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.ports import (
    Holder,
    describe_holders,
    listeners,
    listening_inodes,
    port_free,
)
from mortred_twisted.supervisor.process import ProcessSpec
from mortred_twisted.supervisor.replicas import ReplicaGroup

from .fakes import FakeProber, FakeSpawner


def managed(
    clock: Clock,
    spawner: FakeSpawner,
    prober: Any,
    *,
    held: dict[int, str] | None = None,
    verify: bool = False,
    sid: str = "A",
    port: int = 18121,
) -> ManagedServer:
    holders = held if held is not None else {}
    return ManagedServer(
        sid,
        kind="model",
        spec=ProcessSpec(("python", "-m", "launch", sid), {"X": "1"}),
        probe_url=f"http://{sid}/ready",
        tracker=RestartTracker("on-failure"),
        clock=clock,
        spawner=spawner,
        prober=prober,
        log_buffer=LogBuffer(),
        timing=Timing(probe_interval=0.5, ready_timeout=10, grace=3),
        listen=("127.0.0.1", port),
        port_check=lambda host, p: holders.get(p),
        verify_identity=verify,
    )


def fired(d: Any) -> list[Any]:
    out: list[Any] = []
    d.addBoth(out.append)
    return out


# -- a failed bind is a failed start ------------------------------------------------


def test_a_port_held_by_another_process_is_start_failed_and_nothing_is_spawned() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = managed(clock, sp, pr, held={18121: "pid 4242: python3 -m http.server 18121"})
    result = fired(s.start())
    assert sp.children == [] and result == [False]
    doc = s.status()
    assert doc["state"] == "start_failed" and not doc["ready"]
    assert "127.0.0.1:18121" in doc["error"] and "address in use" in doc["error"]
    assert "pid 4242: python3 -m http.server 18121" in doc["error"]
    clock.advance(120)
    assert sp.children == [] and s.state == "start_failed"  # never retried by itself


def test_a_child_that_cannot_listen_is_start_failed_not_restarted() -> None:
    """The port was free at the check and taken before the child bound it: the child
    exits EXIT_CANNOT_LISTEN; that is a failed start, whatever the restart policy."""
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    held: dict[int, str] = {}
    s = managed(clock, sp, pr, held=held)
    result = fired(s.start())
    assert len(sp.children) == 1
    held[18121] = "pid 77: squatter"
    sp.children[0].exit(code=EXIT_CANNOT_LISTEN)
    assert s.state == "start_failed" and result == [False]
    assert "address in use by pid 77: squatter" in s.status()["error"]
    clock.advance(120)
    assert len(sp.children) == 1


def test_an_operator_start_after_the_holder_left_starts_it() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    held = {18121: "pid 1: x"}
    s = managed(clock, sp, pr, held=held)
    s.start()
    assert s.state == "start_failed"
    del held[18121]
    pr.ready["http://A/ready"] = True
    result = fired(s.start())
    clock.advance(0.5)
    assert s.state == "running" and result == [True] and s.status()["error"] is None


def test_autostart_does_not_count_a_start_failed_model() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    a = managed(clock, sp, pr, held={18121: "pid 9: other"}, sid="A", port=18121)
    b = managed(clock, sp, pr, sid="B", port=18122)
    pr.ready["http://B/ready"] = True
    results = fired(Supervisor([a, b]).start_all(["A", "B"]))
    clock.advance(1)
    assert results == [{"A": False, "B": True}]


def test_a_replica_whose_port_is_held_is_start_failed_and_the_group_says_so() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    members = [
        managed(clock, sp, pr, held={18122: "pid 5: x"}, sid=f"M@{i + 1}", port=18121 + i)
        for i in range(2)
    ]
    group = ReplicaGroup("M", members)
    pr.ready["http://M@1/ready"] = True
    result = fired(group.start())
    clock.advance(1)
    assert result == [False]
    states = [r["state"] for r in group.status()["replicas"]]
    assert states == ["running", "start_failed"]
    assert group.status()["ready_replicas"] == 1


# -- readiness proves identity -------------------------------------------------------


def test_each_spawn_gets_its_own_key_and_each_probe_asks_for_its_proof() -> None:
    clock, sp, pr = Clock(), FakeSpawner(), FakeProber()
    s = managed(clock, sp, pr, verify=True)
    s.start()
    first = sp.children[0].spec.env[SPAWN_KEY_ENV]
    assert sp.children[0].spec.env["X"] == "1" and len(first) >= 40
    clock.advance(0.5)
    assert pr.keys[-1] == first
    sp.children[0].exit(code=1)  # crash: restarted with a new key
    clock.advance(0.5)
    second = sp.children[1].spec.env[SPAWN_KEY_ENV]
    assert second != first
    clock.advance(0.5)
    assert pr.keys[-1] == second
    assert SPAWN_KEY_ENV not in s.spec.env  # never in the shared spec


def test_an_impostor_on_the_port_is_never_ready() -> None:
    clock, sp = Clock(), FakeSpawner()
    answers: list[Any] = []

    def prober(url: str, key: str | None = None) -> defer.Deferred[Any]:
        answers.append(key)
        return defer.succeed(Impostor("HTTP 200 without the proof of this spawn's key"))

    s = managed(clock, sp, prober, verify=True)
    result = fired(s.start())
    clock.advance(3)
    assert not s.ready and s.state == "starting" and result == []
    assert "answered by another process" in s.status()["error"]
    assert "127.0.0.1:18121" in s.status()["error"]
    clock.advance(10)  # past ready_timeout: stopped, never counted
    assert not s.ready and sp.children[0].signals == ["TERM"]


def test_proofs() -> None:
    key = new_spawn_key()
    challenge = new_challenge()
    assert len(challenge) == 32 and challenge != new_challenge()
    good = proof(key, challenge)
    assert proves(key, challenge, good) and proves(key, challenge, good + b" ")
    assert not proves(key, challenge, None)
    assert not proves(key, challenge, proof(new_spawn_key(), challenge))
    assert not proves(key, new_challenge(), good)  # a replayed proof is worthless
    assert answer_challenge(key, challenge) == good
    assert answer_challenge(None, challenge) is None
    assert answer_challenge(key, None) is None and answer_challenge(key, b"") is None
    assert answer_challenge(key, b"x" * (MAX_CHALLENGE + 1)) is None


class _Ready(resource.Resource):
    isLeaf = True

    def __init__(self, key: str | None, code: int = 200) -> None:
        super().__init__()
        self.key = key
        self.code = code
        self.challenges: list[bytes | None] = []

    def render_GET(self, request: Any) -> bytes:
        challenge = request.getHeader(CHALLENGE_HEADER)
        self.challenges.append(challenge)
        answer = answer_challenge(self.key, challenge)
        if answer is not None:
            request.setHeader(PROOF_HEADER, answer)
        request.setResponseCode(self.code)
        return b'{"ready": true}'


@ensureDeferred
async def test_http_prober_takes_only_the_childs_proof() -> None:
    """On real sockets: the child's /ready (it holds the key) is ready; a squatter
    that answers 200 without the proof, or with another key's, is an Impostor."""
    key = new_spawn_key()
    child, squatter, other = _Ready(key), _Ready(None), _Ready(new_spawn_key())
    ports = [
        reactor.listenTCP(0, server.Site(r), interface="127.0.0.1")
        for r in (child, squatter, other)
    ]
    try:
        http = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False)))
        probe = http_prober(http, reactor)
        urls = [f"http://127.0.0.1:{p.getHost().port}/ready" for p in ports]
        assert await probe(urls[0], key) is True
        assert isinstance(await probe(urls[1], key), Impostor)
        assert isinstance(await probe(urls[2], key), Impostor)
        assert await probe(urls[1], None) is True  # no key: no identity asked
        assert child.challenges[0] and child.challenges[0] != squatter.challenges[0]
    finally:
        for p in ports:
            await p.stopListening()


# -- ports and leftovers ---------------------------------------------------------------

_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:46D9 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555 1
   1: 0100007F:46D9 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 556 1
   2: 00000000:46DA 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 557 1
   3: garbage
"""


def test_listening_inodes_reads_only_listening_sockets_of_the_port() -> None:
    assert listening_inodes(_TABLE, 0x46D9) == {555}
    assert listening_inodes(_TABLE, 0x46DA) == {557}
    assert listening_inodes(_TABLE, 1) == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_listening_port_is_not_free_and_its_holder_is_this_process() -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_free("127.0.0.1", port)  # bound, not listening: no conflict
        s.listen(1)
        assert not port_free("127.0.0.1", port)
        assert not port_free("0.0.0.0", port)
        holders = listeners(port)
        assert [h.pid for h in holders] == [os.getpid()]
        assert f"pid {os.getpid()}: " in describe_holders(holders)
    assert port_free("127.0.0.1", port)
    assert describe_holders([]) == "a process not visible to this user"


class _Server:
    def __init__(self, sid: str, port: int, argv: tuple[str, ...]) -> None:
        self.id = sid
        self.listen = ("127.0.0.1", port)
        self.spec = ProcessSpec(argv)
        self.logs = LogBuffer()


def test_leftovers_are_our_own_command_on_our_port_and_others_are_named() -> None:
    ours_argv = ("/usr/bin/python3", "-m", "mortred_twisted.supervisor.launch", "x")
    a, b, c = _Server("A", 1, ours_argv), _Server("B", 2, ("b",)), _Server("C", 3, ("c",))
    held = {
        1: [Holder(10, ours_argv)],
        2: [Holder(11, ("python3", "-m", "http.server"))],
        3: [],  # in use, holder not visible
    }
    ours, others = classify([a, b, c], lambda host, port: held.get(port))
    assert ours == [(a, Holder(10, ours_argv))]
    assert others == [
        (b, "pid 11: python3 -m http.server"),
        (c, "a process not visible to this user"),
    ]


@ensureDeferred
async def test_stop_leftovers_stops_a_real_leftover_and_leaves_a_stranger(
    tmp_path: Path,
) -> None:
    """A process running exactly our spawn command on our port is stopped; one
    running anything else is left alone and reported."""
    import subprocess

    script = (
        "import socket,time\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen()\n"
        "print(s.getsockname()[1],flush=True);time.sleep(60)"
    )
    argv = (sys.executable, "-c", script)
    mine = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    stranger = subprocess.Popen(
        (sys.executable, "-c", script, "other"), stdout=subprocess.PIPE, text=True
    )
    try:
        assert mine.stdout is not None and stranger.stdout is not None
        p1, p2 = int(mine.stdout.readline()), int(stranger.stdout.readline())
        servers = [_Server("A", p1, argv), _Server("B", p2, ("mortred", "B"))]
        lines = await stop_leftovers(servers, reactor, grace=5)
        assert mine.wait(5) is not None
        assert stranger.poll() is None
        assert any(f"pid {mine.pid}" in line and "leftover" in line for line in lines)
        assert any(f"port {p2}" in line and f"pid {stranger.pid}" in line for line in lines)
        assert port_free("127.0.0.1", p1) and not port_free("127.0.0.1", p2)
    finally:
        for p in (mine, stranger):
            if p.poll() is None:
                p.kill()
            p.wait(5)
