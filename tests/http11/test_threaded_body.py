"""Length-framed streamed answers read on threads (``http11/threaded_body.py``) on
real sockets on 127.0.0.1: whole downloads with keep-alive, a slow reader holds a
bounded part of the file, a client that leaves stops the reading and frees the
source, a source that ends short or fails after the head cuts the connection, one
that fails before the head is answered by the app (issue 37 item 1)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task, threads

from mortred_twisted.http11.messages import ServerRequest
from mortred_twisted.http11.server import HTTPServerFactory
from mortred_twisted.http11.threaded_body import ThreadedBody

SIZE = 32 << 20  # a file far larger than any buffer on the way
CHUNK = 64 << 10


def pattern(start: int, n: int) -> bytes:
    """Bytes ``start .. start + n`` of the test file (position-dependent)."""
    first = start // 256
    block = bytes(range(256)) * ((n // 256) + 2)
    return block[start - first * 256 : start - first * 256 + n]


class Source:
    """A file of ``size`` bytes read on threads; records what was read and closed.
    ``short``: it ends this many bytes early; ``fail_at``: reading at that offset
    raises OSError."""

    def __init__(self, size: int, short: int = 0, fail_at: int | None = None) -> None:
        self.size = size - short
        self.fail_at = fail_at
        self.pos = 0
        self.chunk = CHUNK
        self.closed = threading.Event()
        self.reads = 0

    def read(self, n: int) -> bytes:
        if self.fail_at is not None and self.pos >= self.fail_at:
            raise OSError("disk gone")
        n = max(0, min(n, self.size - self.pos))
        data = pattern(self.pos, n)
        self.pos += n
        self.reads += 1
        return data

    def close(self) -> None:
        self.closed.set()


class App:
    """``/file``: the source named by the test, streamed; a failure before the head
    is a 503 of the app's own."""

    def __init__(self) -> None:
        self.source: Source | None = None
        self.body: ThreadedBody | None = None
        self.channel: Any = None

    def dispatch(self, request: ServerRequest) -> Any:
        assert self.source is not None
        self.channel = request.channel
        self.body = ThreadedBody(request, self.source, SIZE, threads.deferToThread)

        def unavailable(failure: Any) -> bytes:
            failure.trap(OSError)
            request.setResponseCode(503)
            return b"store unavailable"

        return self.body.start().addErrback(unavailable)


FACTORIES: dict[int, HTTPServerFactory] = {}


@pytest.fixture
def server() -> Iterator[tuple[App, int]]:
    app = App()
    factory = HTTPServerFactory(app, clock=reactor, max_body_bytes=1000)
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    number = port.getHost().port
    FACTORIES[number] = factory
    yield app, number
    FACTORIES.pop(number, None)
    port.stopListening()


def head_and_rest(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, data
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def read_n(sock: socket.socket, have: bytes, n: int) -> bytes:
    """``n`` body bytes (fewer if the server closes first)."""
    parts, got = [have], len(have)
    while got < n:
        more = sock.recv(min(1 << 20, n - got))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def get(sock: socket.socket, path: bytes = b"/file") -> None:
    sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")


async def until(check: Any, what: str, limit_s: float = 20.0) -> None:
    """Poll ``check()`` on the reactor (bounded), failing with ``what``."""
    for _ in range(int(limit_s / 0.01)):
        if check():
            return
        await task.deferLater(reactor, 0.01)
    raise AssertionError(f"never happened: {what}")


@pytest_twisted.ensureDeferred
async def test_a_whole_download_is_framed_by_its_length_and_keeps_the_connection(
    server: tuple[App, int],
) -> None:
    app, port = server

    def client() -> list[tuple[bytes, bytes]]:
        out = []
        with socket.create_connection(("127.0.0.1", port)) as s:
            for _ in range(2):  # the same connection twice: keep-alive kept
                app.source = Source(SIZE)
                get(s)
                head, rest = head_and_rest(s)
                out.append((head, read_n(s, rest, SIZE)))
        return out

    answers = await threads.deferToThread(client)
    for head, body in answers:
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Length: %d" % SIZE in head and b"chunked" not in head.lower()
        assert len(body) == SIZE and body == pattern(0, SIZE)
    assert app.source is not None and app.source.closed.is_set()


@pytest_twisted.ensureDeferred
async def test_a_slow_reader_holds_a_bounded_part_of_the_file_and_may_finish(
    server: tuple[App, int],
) -> None:
    """A client that stops reading pauses the reading: what was read from the source
    stays a few chunks (plus socket buffers), not the file; it reads on and gets it
    all."""
    app, port = server
    app.source = source = Source(SIZE)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    try:
        get(sock)
        head, rest = await threads.deferToThread(head_and_rest, sock)
        assert head.startswith(b"HTTP/1.1 200 ")
        await until(lambda: app.body is not None and app.body._paused, "the producer paused")
        held = source.pos
        assert held < 8 << 20, held  # the socket buffers and a chunk, not 32 MiB
        body = await threads.deferToThread(read_n, sock, rest, SIZE)
        assert len(body) == SIZE and body == pattern(0, SIZE)
    finally:
        sock.close()


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_stops_the_reading_and_closes_the_source(
    server: tuple[App, int],
) -> None:
    app, port = server
    app.source = source = Source(SIZE)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    get(sock)
    await threads.deferToThread(head_and_rest, sock)
    await until(lambda: app.body is not None and app.body._paused, "the producer paused")
    transport = app.channel.transport
    assert len(transport.dataBuffer) + transport._tempDataLen > 0  # Twisted holds a part
    sock.close()
    await until(source.closed.is_set, "the source closed")
    # what the client will never take is freed at once, not when the GC finds the
    # connection's cycles
    assert transport.dataBuffer == b"" and transport._tempDataBuffer == []
    assert source.pos < SIZE
    assert app.body is not None and app.body.done.called  # no read is asked for again


@pytest.mark.parametrize("broken", ["short", "fails"])
@pytest_twisted.ensureDeferred
async def test_a_source_that_breaks_after_the_head_cuts_the_connection(
    server: tuple[App, int], broken: str
) -> None:
    """Never a short complete answer: the connection closes before Content-Length
    bytes arrived, and nothing else is answered on it."""
    app, port = server
    if broken == "short":
        app.source = Source(SIZE, short=1000)
    else:
        app.source = Source(SIZE, fail_at=4 * CHUNK)

    def client() -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port)) as s:
            get(s)
            head, rest = head_and_rest(s)
            return head, read_n(s, rest, SIZE + 1)

    head, body = await threads.deferToThread(client)
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: %d" % SIZE in head
    assert len(body) < SIZE  # cut: the client knows it is incomplete
    assert body == pattern(0, len(body))
    await until(app.source.closed.is_set, "the source closed")


@pytest_twisted.ensureDeferred
async def test_a_source_that_fails_before_the_head_is_answered_by_the_app(
    server: tuple[App, int],
) -> None:
    app, port = server
    app.source = Source(SIZE, fail_at=0)

    def client() -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port)) as s:
            get(s)
            head, rest = head_and_rest(s)
            return head, read_n(s, rest, len(b"store unavailable"))

    head, body = await threads.deferToThread(client)
    assert head.startswith(b"HTTP/1.1 503 ")
    assert b"Content-Length: 17" in head and body == b"store unavailable"
    await until(app.source.closed.is_set, "the source closed")


@pytest_twisted.ensureDeferred
async def test_a_drain_lets_a_download_finish_then_closes(server: tuple[App, int]) -> None:
    """SIGTERM's drain ends an event stream at once, but a length-framed answer is
    let finish (cutting it would waste the download): every byte, then the close."""
    app, port = server
    app.source = Source(SIZE)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    try:
        get(sock)
        head, rest = await threads.deferToThread(head_and_rest, sock)
        await until(lambda: app.body is not None and app.body._paused, "the producer paused")
        drained = FACTORIES[port].drain()
        assert not drained.called
        body = await threads.deferToThread(read_n, sock, rest, SIZE)
        assert len(body) == SIZE and body == pattern(0, SIZE)
        assert b"Connection: close" not in head  # decided before the drain
        assert await threads.deferToThread(sock.recv, 1) == b""  # then closed
        await drained
    finally:
        sock.close()


def test_declare_length_none_takes_the_declaration_back() -> None:
    from mortred_twisted.http11.messages import HeaderMap

    request = ServerRequest(b"GET", b"/f", b"HTTP/1.1", HeaderMap(), True)
    request.declare_length(10)
    assert request.responseHeaders.getRawHeaders(b"content-length") == [b"10"]
    request.declare_length(None)
    assert (
        request.length is None and request.responseHeaders.getRawHeaders(b"content-length") is None
    )


def test_pattern_is_position_dependent() -> None:
    assert pattern(0, 300)[256:] == pattern(256, 44) and pattern(5, 3) == bytes([5, 6, 7])
