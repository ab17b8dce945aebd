"""The gateway's HTTP/1.1 server (llhttp framing): RFC rules, keep-alive, pipelining, limits."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.http11.connection import MAX_HEAD, MAX_PIPELINED
from mortred_twisted.http11.messages import ServerRequest
from mortred_twisted.http11.server import HTTPServerFactory


class StubApp:
    """Records requests; answers ``answer`` bytes, or a Deferred when ``defer_next``."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, bytes, bytes, dict[bytes, list[bytes]]]] = []
        self.pending: list[defer.Deferred[bytes]] = []
        self.defer_next = False
        self.raise_next = False
        self.cancelled = 0

    def dispatch(self, request: ServerRequest) -> Any:
        body = request.content.read() if request.content is not None else b""
        headers = {k: v for k, (_, v) in request.requestHeaders._items.items()}
        self.requests.append((request.method, request.uri, body, headers))
        if self.raise_next:
            raise RuntimeError("boom")
        request.setHeader(b"Content-Type", b"text/plain")
        request.setHeader(b"X-Path", request.path)
        if self.defer_next:
            d: defer.Deferred[bytes] = defer.Deferred(self._cancel)
            self.pending.append(d)
            return d
        return b"ok " + request.uri

    def _cancel(self, _: Any) -> None:
        self.cancelled += 1


class Conn:
    def __init__(self, **kw: Any) -> None:
        self.app = StubApp()
        self.clock = Clock()
        self.refused: list[int] = []
        self.factory = HTTPServerFactory(
            self.app,
            clock=self.clock,
            max_body_bytes=kw.pop("max_body_bytes", 32),
            on_refused=self.refused.append,
            **kw,
        )
        self.factory.doStart()
        self.proto = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        assert self.proto is not None
        self.transport = StringTransport()
        self.proto.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def out(self) -> bytes:
        value = self.transport.value()
        self.transport.clear()
        return value


def responses(raw: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Split a byte stream into (status, headers, body) by Content-Length."""
    found = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b": ")
            headers[name.lower()] = value
        length = 0 if status == 100 else int(headers[b"content-length"])
        found.append((status, headers, raw[:length]))
        raw = raw[length:]
    return found


GET = b"GET /a?q=1 HTTP/1.1\r\nHost: h\r\n\r\n"


def test_keep_alive_answers_in_one_write_with_server_headers() -> None:
    c = Conn()
    c.send(GET)
    c.send(b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    (s1, h1, b1), (s2, _, b2) = responses(c.out())
    assert (s1, b1, s2, b2) == (200, b"ok /a?q=1", 200, b"ok /b")
    assert h1[b"x-path"] == b"/a" and h1[b"content-type"] == b"text/plain"
    assert h1[b"server"] == b"mortred" and h1[b"date"].endswith(b" GMT")
    assert b"connection" not in h1 and not c.transport.disconnecting


def test_pipelined_requests_wait_for_the_one_in_progress() -> None:
    """Two requests in one read: the second is dispatched only after the first is
    answered, and the answers come in request order."""
    c = Conn()
    c.app.defer_next = True
    c.send(GET + b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    assert len(c.app.requests) == 1 and c.out() == b""
    c.app.defer_next = False
    c.app.pending[0].callback(b"first")
    answers = responses(c.out())
    assert [b for _, _, b in answers] == [b"first", b"ok /b"]


def test_pipelined_backlog_pauses_reading() -> None:
    """Reading pauses while too many bytes wait behind a request in progress, and
    resumes once they are answered."""
    c = Conn()
    c.app.defer_next = True
    c.send(GET)
    c.app.defer_next = False
    behind = GET * (MAX_PIPELINED // len(GET) + 1)
    c.send(behind)
    assert c.transport.producerState == "paused" and len(c.app.requests) == 1
    c.app.pending[0].callback(b"done")
    assert c.transport.producerState == "producing"
    assert len(c.app.requests) == 1 + behind.count(b"GET")


def test_http10_closes_unless_keep_alive() -> None:
    c = Conn()
    c.send(b"GET /a HTTP/1.0\r\n\r\n")
    ((status, headers, _),) = responses(c.out())
    assert status == 200 and headers[b"connection"] == b"close" and c.transport.disconnecting
    c = Conn()
    c.send(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    ((status, headers, _),) = responses(c.out())
    assert headers[b"connection"] == b"keep-alive" and not c.transport.disconnecting


def test_connection_close_is_honoured() -> None:
    c = Conn()
    c.send(b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + GET)
    ((_, headers, _),) = responses(c.out())
    assert headers[b"connection"] == b"close" and c.transport.disconnecting
    assert len(c.app.requests) == 1  # nothing after a close is served


def test_body_split_across_reads() -> None:
    c = Conn()
    c.send(b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123")
    c.send(b"45")
    assert c.app.requests == []
    c.send(b"6789" + GET)
    assert [r[2] for r in c.app.requests] == [b"0123456789", b""]
    assert len(responses(c.out())) == 2


def test_chunked_body_is_decoded_byte_by_byte() -> None:
    c = Conn()
    raw = (
        b"POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n" + GET
    )
    for i in range(len(raw)):
        c.send(raw[i : i + 1])
    assert [r[2] for r in c.app.requests] == [b"hello world", b""]
    assert [s for s, _, _ in responses(c.out())] == [200, 200]


def test_declared_body_over_limit_is_413_at_once() -> None:
    """413 from the head alone: no 100 Continue, no dispatch, the connection closes."""
    c = Conn()
    c.send(b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 33\r\nExpect: 100-continue\r\n\r\n")
    out = c.out()
    ((status, headers, body),) = responses(out)
    assert status == 413 and b"100 Continue" not in out
    assert body == b'{"error": "request entity too large (limit 32 bytes)"}'
    assert headers[b"connection"] == b"close" and c.transport.disconnecting
    assert c.app.requests == [] and c.refused == [413]


def test_chunked_body_over_limit_is_413() -> None:
    """A chunked body is refused as soon as it grows past the limit."""
    c = Conn()
    c.send(b"POST /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + b"a" * 16)
    assert c.out() == b""
    c.send(b"\r\n11\r\n" + b"b" * 17)  # 16 + 17 > 32, before the chunk ends
    ((status, _, _),) = responses(c.out())
    assert status == 413 and c.app.requests == [] and c.transport.disconnecting


def test_expect_continue_within_limit() -> None:
    c = Conn()
    c.send(b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert c.out() == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.send(b"hi")
    ((status, _, _),) = responses(c.out())
    assert status == 200 and c.app.requests[0][2] == b"hi"


H = b"Host: h\r\n"
CHUNKED = b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
CANARY = b"GET /canary HTTP/1.1\r\nHost: h\r\n\r\n"

#: (request bytes, status): every one is refused, closes, and the canary after it
#: is never read (issue 9's smuggling shapes among them).
REFUSED = [
    (b"GET /a\r\n\r\n", 400),  # HTTP/0.9
    (b"GET /a HTTP/2.0\r\n" + H + b"\r\n", 400),
    (b"GET /a HTTP/1.2\r\n" + H + b"\r\n", 400),
    (b"GET a HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"G(T /a HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"BREW /a HTTP/1.1\r\n" + H + b"\r\n", 400),  # not a method llhttp knows
    (b"GET /a HTTP/1.1\r\n" + H + b"Bad Name: x\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\n" + H + b"Host : x\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\n" + H + b"X: a\r\n folded\r\n\r\n", 400),  # obs-fold
    (b"GET /a HTTP/1.1\r\n\r\n", 400),  # no Host
    (b"GET /a HTTP/1.1\r\n" + H + H + b"\r\n", 400),  # two Hosts
    (b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: +1\r\n\r\nx", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 0x1\r\n\r\nx", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nxx", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 2, 2\r\n\r\nxx", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, gzip\r\n\r\n", 400),
    (
        b"POST /a HTTP/1.1\r\n"
        + H
        + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    (b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    (b"POST /a HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\n" + H + b"Expect: 200-ok\r\nContent-Length: 0\r\n\r\n", 417),
    # chunk-size and extension syntax (CVE-2022-24801's shapes)
    (CHUNKED + b"zz\r\n", 400),
    (CHUNKED + b"0x2a\r\n" + b"a" * 42 + b"\r\n0\r\n\r\n", 400),
    (CHUNKED + b"+2a\r\n" + b"a" * 42 + b"\r\n0\r\n\r\n", 400),
    (CHUNKED + b"2_a\r\n" + b"a" * 42 + b"\r\n0\r\n\r\n", 400),
    (CHUNKED + b" 2a\r\n" + b"a" * 42 + b"\r\n0\r\n\r\n", 400),
    (CHUNKED + b"-0\r\n\r\n", 400),
    (CHUNKED + b"2;x\nab\r\n0\r\n\r\n", 400),  # bare LF in an extension
    (CHUNKED + b"2\r\nabXX0\r\n\r\n", 400),  # chunk data not followed by CRLF
    (CHUNKED + b"ffffffffffffffffff\r\n", 400),
    # bare LF/CR, NUL, controls: where smuggling and header injection start
    (b"GET /a HTTP/1.1\r\n" + H + b"X: a\nContent-Length: 5\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\n" + H + b"\r\n", 400),
    (b"GET /a HTTP/1.1\r\n" + H + b"X: a\rb\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n", 400),
    (b"GET /a?x=1\x7f HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET /a?x=\t1 HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET ftp://h/a HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"CONNECT h:443 HTTP/1.1\r\n" + H + b"\r\n", 400),
    # oversize heads
    (b"GET /a HTTP/1.1\r\n" + H + b"X: " + b"a" * (MAX_HEAD + 1) + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * (MAX_HEAD + 1) + b" HTTP/1.1\r\n" + H + b"\r\n", 431),
    (b"GET /a HTTP/1.1\r\n" + H + b"".join(b"X%d: 1\r\n" % i for i in range(300)) + b"\r\n", 431),
    (b"GET /a HTTP/1.1\r\n" + H + b"X: 1\r\n" * 300 + b"\r\n", 431),
]


@pytest.mark.parametrize(("raw", "status"), REFUSED)
def test_bad_requests_are_refused_and_closed(raw: bytes, status: int) -> None:
    """Each malformed or ambiguous request gets its status with Connection: close,
    reaches no route, and the request pipelined after it is never read."""
    c = Conn()
    c.send(raw + CANARY)
    ((got, headers, body),) = responses(c.out())
    assert got == status and body.startswith(b'{"error": ')
    assert headers[b"connection"] == b"close" and c.transport.disconnecting
    assert c.app.requests == [] and c.refused == [status]


def test_refusal_comes_after_the_answers_before_it() -> None:
    """Pipelined: a good request, a smuggling attempt, a canary. The good one is
    answered, then the refusal, then the connection closes; the canary never runs."""
    c = Conn()
    c.app.defer_next = True
    c.send(GET + CHUNKED + b"0x2a\r\n" + b"a" * 42 + b"\r\n0\r\n\r\n" + CANARY)
    assert c.out() == b"" and len(c.app.requests) == 1
    c.app.pending[0].callback(b"first")
    (s1, _, b1), (s2, h2, _) = responses(c.out())
    assert (s1, b1, s2, h2[b"connection"]) == (200, b"first", 400, b"close")
    assert len(c.app.requests) == 1 and c.transport.disconnecting


def test_head_growing_across_reads_is_431() -> None:
    """A head that never ends, sent in pieces, is refused once over the limit."""
    c = Conn()
    c.send(b"GET /a HTTP/1.1\r\nHost: h\r\nX: ")
    for _ in range(3):
        if c.transport.disconnecting:
            break
        c.send(b"a" * 40000)
    ((status, _, _),) = responses(c.out())
    assert status == 431 and c.transport.disconnecting


def test_trailers_never_become_headers() -> None:
    """A chunked body's trailer fields are dropped, not merged into the headers."""
    c = Conn()
    c.send(CHUNKED + b"1\r\na\r\n0\r\nAuthorization: Bearer x\r\n\r\n")
    ((_, _, body, headers),) = c.app.requests
    assert body == b"a" and b"authorization" not in headers


def test_upgrade_is_answered_plainly_then_closed() -> None:
    """An Upgrade request gets an ordinary answer; the bytes after it are never read."""
    c = Conn()
    c.send(b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n" + CANARY)
    ((status, headers, _),) = responses(c.out())
    assert status == 200 and headers[b"connection"] == b"close"
    assert len(c.app.requests) == 1 and c.transport.disconnecting


def test_a_trickled_body_gets_408() -> None:
    """A body still incomplete read_timeout_s after its head is answered 408."""
    c = Conn(idle_timeout_s=10, read_timeout_s=4)
    c.send(b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\n\r\n")
    for _ in range(29):
        c.send(b"x")
        c.clock.advance(0.5)
        if c.transport.disconnecting:
            break
    ((status, headers, _),) = responses(c.out())
    assert status == 408 and headers[b"connection"] == b"close"
    assert c.app.requests == [] and c.refused == [408]


def test_expect_continue_waits_for_its_turn() -> None:
    """100 Continue is sent to a pipelined request only once it is next in line."""
    c = Conn()
    c.app.defer_next = True
    c.send(
        GET + b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert c.out() == b""
    c.app.defer_next = False
    c.app.pending[0].callback(b"first")
    out = c.out()
    assert out.endswith(b"first" + b"HTTP/1.1 100 Continue\r\n\r\n")
    c.send(b"hi")
    assert c.app.requests[1][2] == b"hi"


@pytest.mark.parametrize(
    ("target", "uri"),
    [
        (b"http://gw:8080/v1/x?q=1", b"/v1/x?q=1"),
        (b"HTTPS://gw/v1/x", b"/v1/x"),
        (b"http://gw", b"/"),
        (b"http://gw?q=1", b"/?q=1"),
    ],
)
def test_absolute_form_targets_are_served_as_their_path(target: bytes, uri: bytes) -> None:
    c = Conn()
    c.send(b"GET " + target + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert c.app.requests[0][1] == uri
    assert responses(c.out())[0][2] == b"ok " + uri


def test_head_has_length_but_no_body() -> None:
    c = Conn()
    c.send(b"HEAD /a HTTP/1.1\r\nHost: h\r\n\r\n" + GET)
    out = c.out()
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    first, _, rest = out.partition(b"\r\n\r\n")
    assert b"Content-Length: 5" in first and rest.startswith(b"HTTP/1.1 200 OK")


def test_disconnect_cancels_the_request_in_progress() -> None:
    c = Conn()
    c.app.defer_next = True
    c.send(GET)
    c.proto.connectionLost(None)
    assert c.app.cancelled == 1 and c.app.pending[0].called
    assert c.factory.open_connections == 0


def test_unexpected_errors_are_500_and_close() -> None:
    c = Conn()
    c.app.raise_next = True
    c.send(GET)
    ((status, headers, body),) = responses(c.out())
    assert (status, body) == (500, b"") and headers[b"connection"] == b"close"
    c = Conn()
    c.app.defer_next = True
    c.send(GET)
    c.app.pending[0].errback(RuntimeError("late boom"))
    ((status, _, _),) = responses(c.out())
    assert status == 500 and c.transport.disconnecting


def test_connection_cap() -> None:
    c = Conn(max_connections=1)
    assert c.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5556)) is None
    c.proto.connectionLost(None)
    assert c.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5557)) is not None


def test_idle_connections_are_swept_but_not_busy_ones() -> None:
    c = Conn(idle_timeout_s=10)
    busy = Conn(idle_timeout_s=10)
    busy.app.defer_next = True
    busy.send(GET)
    for conn in (c, busy):
        conn.clock.advance(16)
    assert c.transport.disconnecting and c.out() == b""  # idle: closed without a word
    assert not busy.transport.disconnecting
    c.factory.doStop()
    c.proto.connectionLost(None)  # the close completes
    assert not c.clock.getDelayedCalls()  # neither the sweep nor the abort timer


def test_a_trickled_head_gets_408() -> None:
    """A client sending a head byte by byte (each byte resetting the idle clock) is
    answered 408 once the head has taken longer than the read timeout."""
    c = Conn(read_timeout_s=10)
    for byte in b"GET /slow HTTP/1.1\r\nX-Slow: 1234567890":
        c.send(bytes([byte]))
        c.clock.advance(0.5)
        if c.transport.disconnecting:
            break
    ((status, headers, _),) = responses(c.out())
    assert status == 408 and headers[b"connection"] == b"close"
    assert c.app.requests == [] and c.refused == [408]


def test_access_log_is_opt_in() -> None:
    from twisted.logger import formatEvent, globalLogPublisher

    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        Conn().send(GET)
        assert not any("/a?q=1" in formatEvent(e) for e in events)
        c = Conn(access_log=True)
        c.transport = StringTransport(peerAddress=IPv4Address("TCP", "10.0.0.7", 4242))
        c.proto.makeConnection(c.transport)
        c.send(GET)
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [formatEvent(e) for e in events if "/a?q=1" in formatEvent(e)]
    assert lines == ['10.0.0.7 "GET /a?q=1 HTTP/1.1" 200 9']


def test_drain_closes_idle_connections_and_finishes_busy_ones() -> None:
    """drain(): an idle connection closes at once, a busy one gets its answer (with
    Connection: close) and then closes, new connections are refused, and the
    Deferred fires when the last one is gone."""
    idle, busy = Conn(), Conn()
    busy.factory = idle.factory  # one factory, two connections
    busy.proto = idle.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5556))
    assert busy.proto is not None
    busy.proto.makeConnection(busy.transport)
    idle.app.defer_next = True
    busy.send(GET + GET)  # a request in progress and a pipelined one behind it
    drained = idle.factory.drain()
    assert idle.transport.disconnecting and not drained.called
    idle.proto.connectionLost(None)
    assert idle.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5557)) is None
    idle.app.pending[0].callback(b"last")
    ((status, headers, body),) = responses(busy.out())
    assert (status, body, headers[b"connection"]) == (200, b"last", b"close")
    assert busy.transport.disconnecting and len(idle.app.requests) == 1
    busy.proto.connectionLost(None)
    assert drained.called


def test_drain_with_nothing_open_fires_at_once() -> None:
    c = Conn()
    c.proto.connectionLost(None)
    assert c.factory.drain().called


PIPELINE = (
    GET
    + b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    + CHUNKED
    + b"3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"
    + b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n"
    + CHUNKED
    + b"0x2a\r\n"
    + b"a" * 42
    + b"\r\n0\r\n\r\n"
    + CANARY
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(PIPELINE)), max_size=12))
def test_answers_do_not_depend_on_how_bytes_are_cut(cuts: list[int]) -> None:
    """However a pipeline is cut into reads, the same requests run and the same
    answers come out: four served, the smuggling attempt refused, the canary never."""
    c = Conn()
    start = 0
    for cut in sorted(set(cuts)):
        c.send(PIPELINE[start:cut])
        start = cut
    c.send(PIPELINE[start:])
    assert [(m, b) for m, _, b, _ in c.app.requests] == [
        (b"GET", b""), (b"POST", b"hello"), (b"POST", b"abcde"), (b"HEAD", b"")
    ]  # fmt: skip
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", c.out())
    assert statuses == [b"200"] * 4 + [b"400"]
    assert c.transport.disconnecting and c.refused == [400]
