"""Hostile clients against real processes on loopback (issue 17): the gateway and a
model port decide from the head, bound what a client that does not read can make
them hold, and cap bodies in progress and connections per address.

Memory is read from ``/proc/<pid>/status`` (VmRSS) of the server process; before
these defences, eight unauthenticated 15 MB uploads grew the gateway by 211 MB and a
non-reading pipelining client grew a model port by 481 MB.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.conftest import INTERNAL_TOKEN, MODEL, READ_DEADLINE_S, Target
from tests.security.wire import parse_answers, read_until_closed
from tests.support.servers import RunningServer, model_server
from tests.support.waiting import wait_until

MB = 1024 * 1024
#: Growth allowed for what an attack leaves in a process (allocator noise included).
RSS_SLACK = 48 * MB


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def head_answer(port: int, head: bytes, timeout: float = 10.0) -> tuple[bytes, socket.socket]:
    """Send only ``head`` and read until the server answers and closes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head)
    raw, closed = read_until_closed(sock, timeout)
    assert closed, f"the server kept the connection open after {raw[:120]!r}"
    return raw, sock


def post_head(path: bytes, length: int, extra: bytes = b"") -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\n" % length + extra + b"\r\n"
    )


@pytest.mark.parametrize("name", ["gateway", "model"])
def test_unauthenticated_upload_is_refused_from_its_head(
    processes: dict[str, Target], name: str
) -> None:
    """No credentials, 15 MB announced with Expect: 100-continue: 401 arrives with no
    body byte sent and no 100 Continue, and the connection is closed."""
    target = processes[name]
    raw, sock = head_answer(target.port, post_head(target.post_path, 15 * MB))
    sock.close()
    assert raw.startswith(b"HTTP/1.1 401 "), raw[:200]
    assert b"100 Continue" not in raw and b"connection: close" in raw.lower()


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [
        (b"/v1/models/NO_SUCH_MODEL/jobs", b"POST", 404),
        (b"/nowhere", b"POST", 404),
        (f"/v1/models/{MODEL}/jobs/abc".encode(), b"PUT", 405),
    ],
)
def test_gateway_answers_unknown_routes_and_methods_from_the_head(
    processes: dict[str, Target], path: bytes, method: bytes, status: int
) -> None:
    target = processes["gateway"]
    head = post_head(path, 15 * MB, target.auth).replace(b"POST", method, 1)
    raw, sock = head_answer(target.port, head)
    sock.close()
    assert raw.startswith(b"HTTP/1.1 %d " % status), raw[:200]


@pytest.mark.parametrize("name", ["gateway", "model"])
def test_wrong_content_type_is_415_from_the_head(processes: dict[str, Target], name: str) -> None:
    target = processes[name]
    head = post_head(target.post_path, 15 * MB, target.auth).replace(
        b"application/json", b"text/plain"
    )
    raw, sock = head_answer(target.port, head)
    sock.close()
    assert raw.startswith(b"HTTP/1.1 415 "), raw[:200]


def test_model_port_answers_unknown_routes_from_the_head(processes: dict[str, Target]) -> None:
    target = processes["model"]
    raw, sock = head_answer(target.port, post_head(b"/nowhere", 15 * MB, target.auth))
    sock.close()
    assert raw.startswith(b"HTTP/1.1 404 "), raw[:200]


def test_eight_unauthenticated_uploads_cost_the_gateway_nothing(
    processes: dict[str, Target],
) -> None:
    """Eight clients streaming 15 MB bodies without credentials: each is refused
    from its head, and the gateway's memory does not grow by their bodies."""
    target = processes["gateway"]
    before = rss(target.process.pid)
    chunk = b"x" * 65536
    for _ in range(8):
        sock = socket.create_connection(("127.0.0.1", target.port), timeout=10)
        sock.sendall(post_head(target.post_path, 15 * MB).replace(b"Expect: 100-continue\r\n", b""))
        sent = 0
        with contextlib.suppress(OSError):
            sock.settimeout(2)
            while sent < 15 * MB:
                sent += sock.send(chunk)
        raw, _ = read_until_closed(sock, 5)
        sock.close()
        assert raw.startswith(b"HTTP/1.1 401 "), raw[:200]
    assert rss(target.process.pid) - before < RSS_SLACK


def _flood_without_reading(port: int, request: bytes, limit: int) -> int:
    """Pipeline ``request`` on one connection that never reads, until the server stops
    taking bytes (a send times out) or ``limit`` bytes went out; the bytes sent."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(3)
    batch = request * 256
    sent = 0
    try:
        while sent < limit:
            sent += sock.send(batch)
    except (TimeoutError, OSError):
        pass
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # reset: nothing more is sent to it
    return sent


@pytest.fixture(scope="module")
def limited_model() -> Iterator[RunningServer]:
    """The fake async model with a 1 MB body budget and 4 connections per address."""
    env = {
        "MORTRED_AUTH_TOKEN": INTERNAL_TOKEN,
        "MORTRED_BODY_BUDGET": "1",
        "MORTRED_MAX_CONNECTIONS_PER_CLIENT": "4",
    }
    with model_server(f"conf/server/fake/{MODEL.lower()}.toml", env=env) as srv:
        yield srv


def test_a_client_that_does_not_read_cannot_grow_a_model_port(
    limited_model: RunningServer,
) -> None:
    """Pipelined GET /openapi.json that are never read: the port stops reading once
    its answers back up (it takes far less than the 40 MB offered) and its memory
    stays bounded (481 MB from 6 MB of requests before)."""
    pid = limited_model.process.pid
    before = rss(pid)
    request = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
    sent = _flood_without_reading(limited_model.port, request, 40 * MB)
    assert sent < 40 * MB, "the server never stopped reading"
    assert rss(pid) - before < RSS_SLACK
    status, _, body = limited_model.request("GET", "/metrics")
    assert status == 200 and b"mortred_http_write_pauses_total" in body
    paused = [ln for ln in body.splitlines() if ln.startswith(b"mortred_http_write_pauses_total")]
    assert float(paused[0].split()[1]) >= 1


def test_a_client_that_does_not_read_cannot_grow_the_gateway(processes: dict[str, Target]) -> None:
    target = processes["gateway"]
    before = rss(target.process.pid)
    sent = _flood_without_reading(target.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 40 * MB)
    assert sent < 40 * MB, "the gateway never stopped reading"
    assert rss(target.process.pid) - before < RSS_SLACK


def test_body_budget_answers_503_from_the_head(limited_model: RunningServer) -> None:
    """Two authenticated uploads of 700 kB each on a 1 MB budget, the first with all
    but its last byte sent (the budget holds bytes read, never a head alone): the
    second is a 503 with Retry-After before any of its body is sent."""
    auth = b"Authorization: Bearer " + INTERNAL_TOKEN.encode() + b"\r\n"
    first = socket.create_connection(("127.0.0.1", limited_model.port), timeout=10)
    try:
        head = post_head(b"/jobs", 700_000, auth).replace(b"Expect: 100-continue\r\n", b"")
        first.sendall(head + b" " * 699_999)

        def held() -> float:
            _, _, body = limited_model.request("GET", "/metrics")
            line = next(
                ln for ln in body.splitlines() if ln.startswith(b"mortred_http_body_bytes_held ")
            )
            return float(line.split()[1])

        wait_until(lambda: held() >= 699_999, 10, "the first body read")

        def second() -> bytes:
            raw, sock = head_answer(limited_model.port, post_head(b"/jobs", 700_000, auth))
            sock.close()
            return raw

        raw = wait_until(lambda: (r := second()).startswith(b"HTTP/1.1 503 ") and r, 10,
                         "a 503 for the second upload")  # fmt: skip
        (answer,) = parse_answers(raw)
        assert answer.headers.get("retry-after") == "1"
    finally:
        first.close()


def _served_connections(port: int, n: int) -> list[socket.socket] | None:
    """``n`` connections each answered once, or None (all closed) if one was not
    (connections of earlier tests may not be gone from the server yet)."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            if not sock.recv(65536).startswith(b"HTTP/1.1 200 "):
                raise OSError("not served")
    except OSError:
        for sock in held:
            sock.close()
        return None
    return held


def test_connections_per_address_are_capped(limited_model: RunningServer) -> None:
    """A fifth connection from one address is closed at once; the four others still
    work, and a slot frees when one closes."""
    port = limited_model.port
    held = wait_until(lambda: _served_connections(port, 4), 10, "four served connections")
    try:
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        with contextlib.suppress(OSError):
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        raw, closed = read_until_closed(extra, 10)
        extra.close()
        assert closed and raw == b""
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: _served_connections(port, 1), 10, "a free slot")


# -- the supervisor (:8787) ------------------------------------------------------------


@pytest.fixture(scope="module")
def supervisor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A supervisor (its gateway, no model) with short deadlines; its API port."""
    from tests.control.plane import control_plane

    tmp = tmp_path_factory.mktemp("supervisor-abuse")
    toml = f"read_timeout_s = {READ_DEADLINE_S}\nidle_timeout_s = 5"
    with control_plane(tmp, [], supervisor_toml=toml) as plane:
        plane.wait_ready(["gateway"])
        yield plane.api_port


def test_supervisor_refuses_an_unauthenticated_upload_from_its_head(supervisor: int) -> None:
    """A 40 MB POST without the token: 401 from the head, no 100 Continue, closed."""
    raw, sock = head_answer(supervisor, post_head(b"/api/v1/infer", 40 * MB))
    sock.close()
    assert raw.startswith(b"HTTP/1.1 401 "), raw[:200]
    assert b"100 Continue" not in raw and b"content-security-policy" in raw.lower()


def test_supervisor_times_out_a_trickled_head(supervisor: int) -> None:
    """Slowloris: a head sent a byte at a time, never finished, is answered 408 and
    closed within the read deadline, however often bytes arrive."""
    sock = socket.create_connection(("127.0.0.1", supervisor), timeout=READ_DEADLINE_S + 15)
    try:
        head = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        sock.sendall(head)
        sock.settimeout(0.2)
        answer = b""
        for _ in range(int((READ_DEADLINE_S + 10) / 0.2)):
            try:
                sock.send(b"a")
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    finally:
        sock.close()
