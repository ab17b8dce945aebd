"""LimitedSite (the model server's Site): 413 right after the headers, a connection
cap, a read deadline (408), and the safe encoding of echoed header values."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource

from mortred_twisted.http.framing import header_value
from mortred_twisted.http.limits import EarlyResponse, LimitedSite


class Recorder(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def render(self, request: Any) -> bytes:
        self.calls += 1
        return b"ok"


def site_for(root: Resource, max_connections: int = 0, clock: Clock | None = None) -> LimitedSite:
    def too_large(method: bytes, path: bytes, headers: Any, length: int) -> EarlyResponse:
        body = json.dumps({"error": f"too large: {length}", "path": path.decode()}).encode()
        return EarlyResponse(413, body, {"X-Request-ID": "☃"})

    return LimitedSite(
        root, 10, too_large, max_connections=max_connections, read_timeout_s=5,
        reactor=clock or Clock(),
    )  # fmt: skip


def connect(site: LimitedSite) -> tuple[Any, StringTransport]:
    proto = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def test_content_length_over_limit_is_413_before_body() -> None:
    """A Content-Length over the limit is answered 413 with no 100 Continue; no route runs."""
    res = Recorder()
    proto, transport = connect(site_for(res))
    proto.dataReceived(
        b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n"
    )
    out = transport.value()
    assert out.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in out
    assert out.endswith(b'{"error": "too large: 11", "path": "/x"}')
    assert b"\r\nX-Request-ID: %E2%98%83\r\n" in out and b"\r\nConnection: close\r\n" in out
    assert transport.disconnecting and res.calls == 0


def test_chunked_body_growing_past_limit_is_413() -> None:
    """A chunked body is cut off with 413 as soon as it exceeds the limit."""
    res = Recorder()
    proto, transport = connect(site_for(res))
    proto.dataReceived(
        b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"
    )
    assert transport.value().startswith(b"HTTP/1.1 413 ") and res.calls == 0


def test_body_within_limit_reaches_route() -> None:
    """A body at the limit is served normally."""
    res = Recorder()
    proto, transport = connect(site_for(res))
    proto.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789")
    assert b"200 OK" in transport.value() and res.calls == 1


def test_connection_cap() -> None:
    """Beyond max_connections new connections are refused; closing one frees a slot."""
    site = site_for(Recorder(), max_connections=1)
    proto, _ = connect(site)
    assert site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5556)) is None
    proto.connectionLost(None)
    assert site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5557)) is not None


def test_a_slow_request_is_408_and_a_quick_one_is_not() -> None:
    """A body still incomplete read_timeout_s after the request's first byte gets 408 (at
    the next sweep) and the connection closes; a request complete in time is served."""
    res, clock = Recorder(), Clock()
    site = site_for(res, clock=clock)
    site.startFactory()
    proto, transport = connect(site)
    proto.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nab")
    clock.advance(4.9)
    proto.dataReceived(b"c")
    assert transport.value() == b"" and not transport.disconnecting
    clock.advance(5 * 0.25 + 0.1)  # the deadline, then at most one sweep interval
    assert transport.value().startswith(b"HTTP/1.1 408 ") and transport.disconnecting
    assert res.calls == 0
    proto, transport = connect(site)
    proto.dataReceived(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
    clock.advance(10)
    assert transport.value().startswith(b"HTTP/1.1 200 ") and not transport.disconnecting


def test_header_value_keeps_visible_ascii_and_escapes_the_rest() -> None:
    """Visible ASCII ids are echoed as they are; anything else is percent-encoded UTF-8,
    so no id can raise while encoding or split the head."""
    assert header_value("req_1-A.b~") == b"req_1-A.b~"
    assert header_value("☃") == b"%E2%98%83"
    assert header_value("a\r\nSet-Cookie: x") == b"a%0D%0ASet-Cookie: x"
    assert header_value("50% é") == b"50%25 %C3%A9"


def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    """A keep-alive connection silent for idle_timeout_s between requests is closed
    (no answer owed); one that keeps sending requests stays open."""
    clock = Clock()
    site = LimitedSite(
        Recorder(), 10, lambda *a: EarlyResponse(413, b""), read_timeout_s=5,
        idle_timeout_s=30, reactor=clock,
    )  # fmt: skip
    site.startFactory()
    _idle, idle_transport = connect(site)
    busy, busy_transport = connect(site)
    for _ in range(4):
        busy.dataReceived(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        clock.advance(10)
    assert idle_transport.disconnecting and idle_transport.value() == b""
    assert not busy_transport.disconnecting
    site.stopFactory()


def test_a_client_silent_mid_request_is_timed_out() -> None:
    """A client that stops sending in the middle of a request for idle_timeout_s (here
    shorter than the read deadline) is disconnected without an answer."""
    clock = Clock()
    site = LimitedSite(
        Recorder(), 10, lambda *a: EarlyResponse(413, b""), read_timeout_s=60,
        idle_timeout_s=2, reactor=clock,
    )  # fmt: skip
    site.startFactory()
    proto, transport = connect(site)
    proto.dataReceived(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nab")
    clock.advance(1)
    assert not transport.disconnecting
    clock.advance(2)
    assert transport.disconnecting and transport.value() == b""
    site.stopFactory()
