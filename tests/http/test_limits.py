"""LimitedSite (the model server's Site): 413 right after the headers, a connection
cap, and no resource traversal for a root that matches paths itself."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource

from mortred_twisted.http.limits import EarlyResponse, LimitedSite


class Recorder(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def render(self, request: Any) -> bytes:
        self.calls += 1
        return b"ok"


def site_for(root: Resource, max_connections: int = 0) -> LimitedSite:
    def too_large(method: bytes, path: bytes, headers: Any, length: int) -> EarlyResponse:
        return EarlyResponse(413, json.dumps({"error": f"too large: {length}"}).encode())

    return LimitedSite(root, 10, too_large, max_connections=max_connections)


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
    assert out.endswith(b'{"error": "too large: 11"}')
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


class PathMatcher(Recorder):
    """A leaf root that matches paths itself (like the model server's FastRoutes)."""

    matches_paths_itself = True

    def render(self, request: Any) -> bytes:
        self.calls += 1
        self.postpath = list(request.postpath)
        return b"ok:" + request.path


def test_leaf_root_skips_traversal_with_the_same_answer() -> None:
    """A root that matches paths itself is rendered directly, with Server and Date
    set as twisted.web does; other roots still get their postpath."""
    for root, postpath in ((PathMatcher(), []), (Recorder(), None)):
        proto, transport = connect(site_for(root))
        proto.dataReceived(b"GET /a%2Fb/c HTTP/1.1\r\nHost: h\r\n\r\n")
        out = transport.value()
        assert out.startswith(b"HTTP/1.1 200 OK\r\n") and root.calls == 1
        assert b"\r\nServer: TwistedWeb/" in out and b"\r\nDate: " in out and b" GMT\r\n" in out
        if postpath is not None:
            assert out.endswith(b"ok:/a%2Fb/c") and root.postpath == postpath  # type: ignore[attr-defined]
