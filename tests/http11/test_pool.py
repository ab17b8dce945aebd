"""The lean pooled upstream client (llhttp framing), over MemoryReactorClock + StringTransport."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from mortred_twisted.http11.pool import LeanUpstreamClient
from mortred_twisted.http11.upstream import (
    UpstreamTimeout,
    UpstreamTransportError,
    UpstreamUnavailable,
)

URL = "http://127.0.0.1:18100/jobs/job_a"
OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}'


class Net:
    """A client over a memory reactor; :meth:`accept` completes the next connect."""

    def __init__(self, recv_timeout_s: float = 5.0) -> None:
        self.reactor = MemoryReactorClock()
        self.client = LeanUpstreamClient(self.reactor, recv_timeout_s=recv_timeout_s)
        self.accepted = 0

    def accept(self) -> tuple[Any, StringTransport]:
        _h, _p, factory, _timeout, _bind = self.reactor.tcpClients[self.accepted]
        self.accepted += 1
        proto = factory.buildProtocol(None)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def refuse(self) -> None:
        _h, _p, factory, _t, _b = self.reactor.tcpClients[self.accepted]
        self.accepted += 1
        factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))

    def get(self, url: str = URL, **kw: Any) -> tuple[defer.Deferred[Any], list[Any]]:
        d = self.client.request("GET", url, {b"x-request-id": [b"r1"]}, **kw)
        out: list[Any] = []
        d.addBoth(out.append)
        return d, out


def test_request_bytes_and_keep_alive_reuse() -> None:
    """One write per request; a complete response returns the connection to the pool."""
    n = Net()
    _, out = n.get()
    proto, transport = n.accept()
    sent = transport.value()
    assert sent.startswith(b"GET /jobs/job_a HTTP/1.1\r\nHost: 127.0.0.1:18100\r\n")
    assert b"x-request-id: r1\r\n" in sent and sent.endswith(b"\r\n\r\n")
    proto.dataReceived(OK[:30])
    assert out == []
    proto.dataReceived(OK[30:])
    response = out[0]
    assert response.code == 200 and response.body == b'{"a":1}'
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    assert n.client.idle_count("127.0.0.1", 18100) == 1
    transport.clear()
    _, out2 = n.get()
    assert len(n.reactor.tcpClients) == 1  # reused, no new connect
    assert transport.value().startswith(b"GET /jobs/job_a")
    proto.dataReceived(OK)
    assert out2[0].code == 200 and n.client.idle_count("127.0.0.1", 18100) == 1
    assert not n.reactor.getDelayedCalls()


def test_post_body_and_content_length() -> None:
    n = Net()
    d = n.client.request("POST", "http://127.0.0.1:18100/jobs", {}, b'{"x":1}')
    out: list[Any] = []
    d.addBoth(out.append)
    proto, transport = n.accept()
    assert transport.value().endswith(b'content-length: 7\r\n\r\n{"x":1}')
    proto.dataReceived(b"HTTP/1.1 202 Accepted\r\nLocation: /jobs/j\r\nContent-Length: 0\r\n\r\n")
    assert out[0].code == 202 and out[0].body == b""
    assert out[0].headers.getRawHeaders("location") == [b"/jobs/j"]


def test_chunked_response_is_decoded() -> None:
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    proto.dataReceived(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    proto.dataReceived(b"2\r\nde\r\n0\r\n\r\n")
    assert out[0].code == 404 and out[0].body == b"abcde"
    assert n.client.idle_count("127.0.0.1", 18100) == 1


def test_connection_close_answer_is_not_pooled() -> None:
    n = Net()
    _, out = n.get()
    proto, transport = n.accept()
    proto.dataReceived(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    assert out[0].body == b"ok" and transport.disconnecting
    assert n.client.idle_count("127.0.0.1", 18100) == 0


def test_connection_lost_mid_response_is_502() -> None:
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    proto.dataReceived(OK[:-3])
    proto.connectionLost(Failure(ConnectionLost("reset")))
    assert isinstance(out[0].value, UpstreamTransportError)
    assert n.client.idle_count("127.0.0.1", 18100) == 0


def test_garbage_is_502() -> None:
    n = Net()
    _, out = n.get()
    proto, transport = n.accept()
    proto.dataReceived(b"SSH-2.0-OpenSSH\r\n\r\n")
    assert isinstance(out[0].value, UpstreamTransportError) and transport.disconnecting


def test_refused_is_503() -> None:
    n = Net()
    _, out = n.get()
    n.refuse()
    assert isinstance(out[0].value, UpstreamUnavailable)
    assert not n.reactor.getDelayedCalls()


def test_timeout_is_504_and_connection_dropped() -> None:
    n = Net(recv_timeout_s=2.0)
    _, out = n.get()
    proto, transport = n.accept()
    n.reactor.advance(1.9)
    assert out == []
    n.reactor.advance(0.1)
    assert isinstance(out[0].value, UpstreamTimeout)
    assert transport.disconnecting  # aborted: a half-used connection is never pooled
    proto.dataReceived(OK)  # late bytes do not resurrect it
    assert n.client.idle_count("127.0.0.1", 18100) == 0


def test_cancel_aborts_and_never_pools() -> None:
    n = Net()
    d, out = n.get()
    proto, transport = n.accept()
    d.cancel()
    assert out[0].check(defer.CancelledError) and transport.disconnecting
    proto.connectionLost(Failure(ConnectionDone()))
    assert n.client.idle_count("127.0.0.1", 18100) == 0
    assert not n.reactor.getDelayedCalls()


def test_cancel_while_connecting() -> None:
    n = Net()
    d, out = n.get()
    d.cancel()
    assert out[0].check(defer.CancelledError)
    assert n.reactor.connectors[0]._disconnected  # type: ignore[attr-defined]


def test_stale_pooled_connection_retried_once_for_get() -> None:
    """The server closed an idle connection as we wrote: a GET goes on a fresh one."""
    n = Net()
    n.get()
    proto, _ = n.accept()
    proto.dataReceived(OK)
    _, out = n.get()
    proto.connectionLost(Failure(ConnectionDone()))
    assert out == [] and len(n.reactor.tcpClients) == 2
    proto2, _ = n.accept()
    proto2.dataReceived(OK)
    assert out[0].code == 200


def test_stale_pooled_connection_not_retried_for_post() -> None:
    n = Net()
    n.get()
    proto, _ = n.accept()
    proto.dataReceived(OK)
    d = n.client.request("POST", "http://127.0.0.1:18100/jobs", {}, b"{}")
    out: list[Any] = []
    d.addBoth(out.append)
    proto.connectionLost(Failure(ConnectionDone()))
    assert isinstance(out[0].value, UpstreamTransportError)


def test_idle_pool_is_capped() -> None:
    n = Net()
    n.client.max_idle_per_host = 1
    pending = [n.get()[1] for _ in range(2)]
    (p1, _), (p2, t2) = n.accept(), n.accept()
    p1.dataReceived(OK)
    p2.dataReceived(OK)
    assert all(o[0].code == 200 for o in pending)
    assert n.client.idle_count("127.0.0.1", 18100) == 1 and t2.disconnecting


@pytest.mark.parametrize("status", [204, 304])
def test_bodyless_statuses(status: int) -> None:
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    proto.dataReceived(b"HTTP/1.1 %d X\r\n\r\n" % status)
    assert out[0].code == status and out[0].body == b""


def test_close_aborts_everything() -> None:
    n = Net()
    n.get()
    _, transport = n.accept()
    n.client.close()
    assert transport.disconnecting


def test_gateway_copies_raw_headers_from_the_lean_client() -> None:
    """Repeated names are kept, hop-by-hop ones dropped, Location rewritten."""
    from mortred_twisted.config.catalog import Catalog, CatalogEntry
    from mortred_twisted.gateway.access import AccessPolicy
    from mortred_twisted.gateway.apikeys import KeyRing
    from mortred_twisted.http.gateway import GatewayApp
    from mortred_twisted.http11.pool import RawHeaders
    from mortred_twisted.http11.ratelimit import RateLimiter
    from mortred_twisted.http11.server import HTTPServerFactory
    from mortred_twisted.http11.upstream import UpstreamResponse
    from tests.support.memory_http import MemoryClient

    class Fake:
        def body_for(self, content: Any, length: int) -> bytes:
            content.seek(0)
            return bytes(content.read())

        def request(self, *a: Any) -> defer.Deferred[UpstreamResponse]:
            pairs = [
                (b"Location", b"/jobs/job_x"),
                (b"Set-Cookie", b"a=1"),
                (b"Set-Cookie", b"b=2"),
                (b"Connection", b"keep-alive"),
                (b"Content-Length", b"99"),
            ]
            return defer.succeed(
                UpstreamResponse(202, RawHeaders(pairs), b'{"poll_url":"/jobs/job_x"}')
            )

    clock = MemoryReactorClock()
    entry = CatalogEntry("M", "fake", "127.0.0.1", 18100, "/infer", True, 16, "m.toml")
    app = GatewayApp(
        catalog=Catalog([entry]),
        policy=AccessPolicy(static_token="t", keys=KeyRing([]), limiter=RateLimiter(clock.seconds)),
        upstream=Fake(),  # type: ignore[arg-type]
        clock=clock,
    )
    client = MemoryClient(HTTPServerFactory(app, clock=clock, max_body_bytes=1 << 20))
    d = client.post(
        "http://gw/v1/models/M/jobs",
        data=b"{}",
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
    )
    client.flush()
    out: list[Any] = []
    d.addCallback(lambda r: r.content().addCallback(lambda b: out.append((r, b))))
    response, body = out[0]
    assert response.code == 202
    assert response.headers.getRawHeaders("set-cookie") == ["a=1", "b=2"]
    assert response.headers.getRawHeaders("location") == ["/v1/models/M/jobs/job_x"]
    assert response.headers.getRawHeaders("content-length") == [str(len(body))]
    assert not response.headers.hasHeader("connection")
    assert body == b'{"poll_url":"/v1/models/M/jobs/job_x"}'


def test_body_in_many_pieces_and_chunked_across_boundaries() -> None:
    """Large bodies arrive cut anywhere; every framing reassembles them exactly."""
    body = bytes(range(256)) * 400
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    for i in range(0, len(wire), 997):
        proto.dataReceived(wire[i : i + 997])
    assert out[0].body == body
    _, out = n.get()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(0, len(body), 30000):
        piece = body[i : i + 30000]
        chunked += b"%x\r\n" % len(piece) + piece + b"\r\n"
    chunked += b"0\r\n\r\n"
    for i in range(0, len(chunked), 1001):
        proto.dataReceived(chunked[i : i + 1001])
    assert out[0].body == body and n.client.idle_count("127.0.0.1", 18100) == 1


def test_read_to_close_body_is_502() -> None:
    """A response framed by the connection's close (no length) is refused: llhttp
    cannot tell it from a cut one through httptools, and model ports never send it."""
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    proto.dataReceived(b"HTTP/1.0 200 OK\r\n\r\npart1-")
    proto.dataReceived(b"part2")
    assert out == []
    proto.connectionLost(Failure(ConnectionDone()))
    assert isinstance(out[0].value, UpstreamTransportError)
    assert n.client.idle_count("127.0.0.1", 18100) == 0


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    ],
)
def test_ambiguous_responses_are_502(answer: bytes) -> None:
    """llhttp frames responses too: bad chunk sizes, CL+TE, differing lengths,
    obs-fold, bare LF, 1xx and oversize heads are a 502 and the connection is dropped."""
    n = Net()
    _, out = n.get()
    proto, transport = n.accept()
    proto.dataReceived(answer)
    assert isinstance(out[0].value, UpstreamTransportError) and transport.disconnecting
    assert n.client.idle_count("127.0.0.1", 18100) == 0


def test_head_response_has_no_body_and_is_not_pooled() -> None:
    """A HEAD answer ends with its head whatever its Content-Length says."""
    n = Net()
    d = n.client.request("HEAD", URL, {})
    out: list[Any] = []
    d.addBoth(out.append)
    proto, transport = n.accept()
    proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n")
    assert out[0].code == 200 and out[0].body == b"" and transport.disconnecting


def test_trailers_are_dropped() -> None:
    """A chunked answer's trailer fields never become response headers."""
    n = Net()
    _, out = n.get()
    proto, _ = n.accept()
    proto.dataReceived(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-T: 1\r\n\r\n"
    )
    assert out[0].body == b"a" and out[0].headers.getRawHeaders(b"x-t") is None
    assert n.client.idle_count("127.0.0.1", 18100) == 1


def test_large_body_follows_its_head_in_pieces_never_joined() -> None:
    """A body over LARGE_BODY is encoded apart from its head (the caller's bytes
    object itself, no copy) and sent after it in pieces; a small one goes with its
    head in one write."""
    n = Net()
    body = b"x" * (1 << 20)
    _key, encoded = n.client._encode("POST", "http://127.0.0.1:18100/jobs", {}, body)
    assert type(encoded) is tuple and encoded[1] is body
    assert encoded[0].endswith(b"content-length: %d\r\n\r\n" % len(body))
    n.client.request("POST", "http://127.0.0.1:18100/jobs", {}, body)
    _, transport = n.accept()
    assert transport.value().endswith(b"content-length: %d\r\n\r\n" % len(body) + body)
    assert transport.producer is None  # the sender let go once done
    _key, small = n.client._encode("POST", "http://127.0.0.1:18100/jobs", {}, b"x" * 1000)
    assert type(small) is bytes and small.endswith(b"\r\n\r\n" + b"x" * 1000)


def test_extra_bytes_after_body_are_502() -> None:
    n = Net()
    _, out = n.get()
    proto, transport = n.accept()
    proto.dataReceived(OK + b"junk")
    assert isinstance(out[0].value, UpstreamTransportError) and transport.disconnecting


def test_a_paused_stream_stops_reading_its_upstream_and_its_silence_clock() -> None:
    """The client's flow control pauses an upstream stream: its connection stops
    reading, its idle deadline stops counting; resumed, both go on."""
    n = Net()
    got: list[Any] = []
    n.client.stream("GET", URL, {}).addCallback(got.append)
    proto, transport = n.accept()
    proto.dataReceived(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    )
    (stream,) = got
    pieces: list[bytes] = []
    stream.start(pieces.append)
    stream.pauseProducing()
    assert transport.producerState == "paused"
    n.reactor.advance(3600)  # silent for an hour while paused: not cut
    assert not stream.done.called
    stream.resumeProducing()
    assert transport.producerState == "producing"
    proto.dataReceived(b"0\r\n\r\n")
    assert pieces == [b"hello"] and stream.done.called


def test_distinct_urls_pin_no_memory_in_the_client() -> None:
    """Requests whose URLs differ only in a 16 KiB query (a wait query or listing
    cursor a caller picks) leave nothing behind in the client: what it keeps per
    upstream does not grow with the URLs it has seen (before: every distinct URL up
    to 10,000 was kept with its path, ~32 KiB each; ~290 MiB measured at the gateway)."""
    import tracemalloc

    client = LeanUpstreamClient(MemoryReactorClock(), recv_timeout_s=5.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000):
            url = f"http://127.0.0.1:18100/jobs/job_a/wait?timeout={i}&x={'a' * 16_384}"
            key, data = client._encode("GET", url, {}, None)
            assert key == ("127.0.0.1", 18100) and data.startswith(b"GET /jobs/job_a/wait?")
        del data
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1024 * 1024, f"{kept} bytes kept for 2,000 distinct URLs"


def test_the_request_line_is_the_url_path_and_query() -> None:
    """Host header and request target come from the URL as before the cache change."""
    client = LeanUpstreamClient(MemoryReactorClock(), recv_timeout_s=5.0)
    key, data = client._encode("GET", "http://[::1]:8080/a/b?c=d", {}, None)
    assert key == ("::1", 8080) and data == b"GET /a/b?c=d HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"
    key, data = client._encode("DELETE", "http://example:81", {}, None)
    assert key == ("example", 81) and data.startswith(b"DELETE / HTTP/1.1\r\nHost: example:81\r\n")
