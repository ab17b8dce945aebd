"""Large request bodies forwarded upstream on real sockets on 127.0.0.1 (issue 37
item 1: an upload through the gateway is not held twice): sent after the head a
piece at a time at the upstream's pace, Twisted holding a bounded part of it while
the upstream does not read; the whole body arrives; an upstream that answers before
reading it all gets its connection closed, never pooled."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task, threads

from mortred_twisted.http11.pool import LeanUpstreamClient

SIZE = 16 << 20
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Upstream:
    """A one-connection server with a small receive buffer: reads the head, waits
    for ``go``, then reads ``SIZE`` body bytes (or none, ``early``) and answers."""

    def __init__(self, early: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.go = threading.Event()
        self.early = early
        self.received = b""

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            _head, _, rest = data.partition(b"\r\n\r\n")
            if self.early:
                conn.sendall(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n")
                self.go.wait(30)
                return
            self.go.wait(30)
            parts, got = [rest], len(rest)
            while got < SIZE:
                more = conn.recv(1 << 20)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            self.received = b"".join(parts)
            conn.sendall(OK)


@pytest.fixture
def client() -> Iterator[LeanUpstreamClient]:
    c = LeanUpstreamClient(reactor, recv_timeout_s=30)
    yield c
    c.close()


def held(conn: Any) -> int:
    """Bytes Twisted holds for the upstream connection's transport."""
    t = conn.transport
    return len(t.dataBuffer) - t.offset + t._tempDataLen


@pytest_twisted.ensureDeferred
async def test_a_large_body_goes_at_the_upstreams_pace_and_arrives_whole(
    client: LeanUpstreamClient,
) -> None:
    up = Upstream()
    serving = threads.deferToThread(up.serve)
    body = bytes(range(256)) * (SIZE // 256)
    answer = client.request("POST", f"http://127.0.0.1:{up.port}/jobs", {}, body)
    conn: Any = None
    for _ in range(2000):  # bounded wait for the sender to be paused by Twisted
        conn = next(iter(client._all), None)
        sender = getattr(conn, "_sender", None)
        if sender is not None and sender._paused:
            break
        await task.deferLater(reactor, 0.01)
    else:
        raise AssertionError("the body's sender was never paused")
    assert held(conn) < 1 << 20, held(conn)  # a piece or two, not the 16 MiB body
    up.go.set()
    response = await answer
    await serving
    assert response.code == 200 and response.body == b"ok"
    assert up.received == body


@pytest_twisted.ensureDeferred
async def test_an_upstream_that_answers_before_reading_the_body_is_not_pooled(
    client: LeanUpstreamClient,
) -> None:
    up = Upstream(early=True)
    serving = threads.deferToThread(up.serve)
    response = await client.request("POST", f"http://127.0.0.1:{up.port}/jobs", {}, b"x" * SIZE)
    up.go.set()
    await serving
    assert response.code == 413
    assert client.idle_count("127.0.0.1", up.port) == 0
