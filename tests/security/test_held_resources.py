"""What a client can make a port hold, on every port (gateway, model, supervisor), on
real sockets (issue 29): a connection whose client never reads its answers, and the
body budget reserved by heads alone.

Before these defences a client that pipelined GETs and never read kept its
connection open for ever (paused for its writes, requests queued, no deadline), and
sixteen POST heads announcing 16 MB each reserved the whole 256 MB budget, so every
other client's POST was answered 503 until the read deadline.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator

import pytest

from tests.security.conftest import READ_DEADLINE_S, Target
from tests.security.wire import parse_answers, read_until_closed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MB = 1024 * 1024
TARGETS = ("gateway", "model", "supervisor")
#: Every port's defaults: the largest body, and the budget of bodies held at once.
MAX_BODY = 16 * MB
BUDGET = 256 * MB
_TCP_ESTABLISHED = 1


def tcp_state(sock: socket.socket) -> int:
    """The kernel's state of ``sock`` (``tcpi_state`` of TCP_INFO, Linux)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return struct.unpack("B", info[:1])[0]


def stuck_pipeline(port: int, request: bytes, limit: int = 64 * MB) -> socket.socket:
    """A connection that pipelines ``request`` and never reads, until the server stops
    taking bytes (a send blocks for 2 s: its answers have backed up) or resets it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(2)
    batch = request * 256
    sent = 0
    with contextlib.suppress(TimeoutError, ConnectionResetError, BrokenPipeError):
        while sent < limit:
            sent += sock.send(batch)
    assert sent < limit, "the server never stopped reading"
    return sock


@pytest.mark.parametrize("name", TARGETS)
def test_a_client_that_never_reads_loses_its_connection_past_the_write_deadline(
    processes: dict[str, Target], name: str
) -> None:
    """Pipelined GETs never read: once the answers back up the port aborts the
    connection within the write deadline (the read deadline's value) plus its sweep,
    although requests are still queued; the port keeps serving others."""
    target = processes[name]
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    sock = stuck_pipeline(target.port, request)
    try:
        wait_until(
            lambda: tcp_state(sock) != _TCP_ESTABLISHED,
            READ_DEADLINE_S * 2 + 10,
            "the port to abort a connection whose client never reads",
        )
    finally:
        sock.close()
    assert target.alive()


def _announce(target: Target, length: int) -> socket.socket:
    """A POST head announcing ``length`` bytes with ``Expect: 100-continue``, on a
    fresh connection; returns once the port accepted it (its 100 Continue)."""
    sock = socket.create_connection(("127.0.0.1", target.port), timeout=10)
    sock.sendall(
        b"POST " + target.post_path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + target.auth
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n" % length
        + b"Expect: 100-continue\r\n\r\n"
    )  # fmt: skip
    interim = sock.recv(4096)
    assert interim.startswith(b"HTTP/1.1 100 "), interim[:200]
    return sock


@contextlib.contextmanager
def announced(target: Target, n: int, length: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(_announce(target, length))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def framed_post(target: Target) -> int:
    """The status of a small, complete POST of ``{}`` on a fresh connection."""
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        sock.sendall(
            b"POST " + target.post_path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + target.auth
            + b"Content-Type: application/json\r\nContent-Length: 2\r\n"
            + b"Connection: close\r\n\r\n{}"
        )  # fmt: skip
        raw, _ = read_until_closed(sock, 10)
    (answer,) = parse_answers(raw)
    return answer.status


@pytest.mark.parametrize("name", TARGETS)
def test_heads_announcing_the_whole_budget_leave_it_free(
    processes: dict[str, Target], name: str
) -> None:
    """Sixteen accepted heads announcing 16 MB each (the whole 256 MB budget) and no
    body byte: another client's POST is still served, not 503."""
    target = processes[name]
    with announced(target, BUDGET // MAX_BODY, MAX_BODY):
        assert framed_post(target) == target.empty_post_status


@pytest.mark.parametrize(("method", "path"), [(b"GET", b"/healthz"), (b"GET", b"/metrics")])
def test_the_gateway_refuses_a_body_on_a_route_that_takes_none_from_its_head(
    processes: dict[str, Target], method: bytes, path: bytes
) -> None:
    """No credentials, 16 MB announced to /healthz or /metrics: 413 with no 100
    Continue, closed, before a body byte (those routes skipped the head decision)."""
    target = processes["gateway"]
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        sock.sendall(
            method + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % MAX_BODY
        )
        raw, closed = read_until_closed(sock, 10)
    assert raw.startswith(b"HTTP/1.1 413 ") and closed, raw[:200]
    assert b"100 Continue" not in raw and b"takes no request body" in raw


@pytest.mark.parametrize(
    ("name", "method", "path"),
    [
        ("model", b"GET", b"/healthz"),
        ("model", b"DELETE", b"/jobs/job_0123"),
        ("supervisor", b"GET", b"/api/v1/status"),
        ("supervisor", b"DELETE", b"/api/v1/jobs/FAKE_ASYNC/job_0123"),
    ],
)
def test_model_and_supervisor_refuse_a_body_on_a_route_that_takes_none(
    processes: dict[str, Target], name: str, method: bytes, path: bytes
) -> None:
    """With credentials, 16 MB announced to a GET or DELETE route: 413 from the head,
    no 100 Continue, closed (before: 100 Continue, and the body was read)."""
    target = processes[name]
    with socket.create_connection(("127.0.0.1", target.port), timeout=10) as sock:
        sock.sendall(
            method + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + target.auth
            + b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % MAX_BODY
        )  # fmt: skip
        raw, closed = read_until_closed(sock, 10)
    assert raw.startswith(b"HTTP/1.1 413 ") and closed, raw[:200]
    assert b"100 Continue" not in raw and b"takes no request body" in raw
