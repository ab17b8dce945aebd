"""The HTTP server's edge defences, in memory: decisions from the head, the body
budget, the per-address cap, write flow control, HEAD, and answers that raise."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.http11.connection import MAX_PAUSED_WRITE
from mortred_twisted.http11.messages import ServerRequest
from mortred_twisted.http11.server import HTTPServerFactory
from tests.http11.test_server import responses

POST_HEAD = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n%s\r\n"


class JudgingApp:
    """Refuses heads whose path is ``/deny`` (401), lets others in; answers bodies
    with their length, or a Deferred when ``defer_next``; ``stream`` writes pieces."""

    def __init__(self) -> None:
        self.judged: list[tuple[bytes, int]] = []
        self.dispatched: list[bytes] = []
        self.pending: list[defer.Deferred[bytes]] = []
        self.defer_next = False
        self.bad_header = False
        self.requests: list[ServerRequest] = []

    def refuse_head(self, request: ServerRequest, length: int) -> bytes | None:
        self.judged.append((request.path, length))
        if request.path == b"/deny":
            request.setResponseCode(401)
            request.setHeader(b"WWW-Authenticate", b"Bearer")
            return b'{"error":"unauthorized"}'
        return None

    def dispatch(self, request: ServerRequest) -> Any:
        self.requests.append(request)
        body = request.content.read() if request.content is not None else b""
        self.dispatched.append(request.path)
        if self.bad_header:
            request.responseHeaders._items[b"x-bad"] = (b"X-Bad", ["not bytes"])  # type: ignore[list-item]
        if self.defer_next:
            d: defer.Deferred[bytes] = defer.Deferred()
            self.pending.append(d)
            return d
        return b"%d" % len(body)


class Server:
    def __init__(self, **kw: Any) -> None:
        self.app = JudgingApp()
        self.clock = Clock()
        self.factory = HTTPServerFactory(
            self.app, clock=self.clock, max_body_bytes=kw.pop("max_body_bytes", 1000), **kw
        )

    def connect(self, host: str = "127.0.0.1") -> tuple[Any, StringTransport]:
        proto = self.factory.buildProtocol(IPv4Address("TCP", host, 5555))
        transport = StringTransport(peerAddress=IPv4Address("TCP", host, 5555))
        if proto is not None:
            proto.makeConnection(transport)
        return proto, transport


def test_a_refused_head_is_answered_before_any_body_byte_and_without_100_continue() -> None:
    """401 decided from the head of a POST announcing a body: no 100 Continue, the
    connection closes, and body bytes sent afterwards are never read."""
    s = Server()
    proto, t = s.connect()
    proto.dataReceived(b"POST /deny HTTP/1.1\r\nHost: h\r\nContent-Length: 900\r\n"
                       b"Expect: 100-continue\r\n\r\n")  # fmt: skip
    out = t.value()
    assert out.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in out
    assert b"Connection: close" in out and t.disconnecting
    proto.dataReceived(b"x" * 900)
    assert s.app.dispatched == [] and s.factory.body_bytes_held == 0


def test_the_app_judges_only_heads_that_carry_a_body() -> None:
    """GETs go straight to dispatch; a chunked body is judged with length -1."""
    s = Server()
    proto, t = s.connect()
    proto.dataReceived(b"GET /deny HTTP/1.1\r\nHost: h\r\n\r\n")
    proto.dataReceived(b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"3\r\nabc\r\n0\r\n\r\n")  # fmt: skip
    assert s.app.judged == [(b"/c", -1)]
    assert [b for _, _, b in responses(t.value())] == [b"0", b"3"]


def test_body_budget_refuses_from_the_head_and_never_drifts() -> None:
    """A declared body that does not fit in what the budget has free is a 503 with
    Retry-After from its head; the budget comes back when the requests are answered
    or lost."""
    s = Server(body_budget_bytes=1000)
    a, ta = s.connect()
    a.dataReceived(POST_HEAD % (700, b"") + b"y" * 699)  # held as read
    assert s.factory.body_bytes_held == 699
    b, tb = s.connect()
    b.dataReceived(POST_HEAD % (400, b""))
    ((status, headers, _),) = responses(tb.value())
    assert status == 503 and headers[b"retry-after"] == b"1" and tb.disconnecting
    assert s.factory.budget_refusals == 1
    a.dataReceived(b"y")
    assert responses(ta.value())[0][2] == b"700"
    assert s.factory.body_bytes_held == 0
    c, _ = s.connect()
    s.app.defer_next = True
    c.dataReceived(POST_HEAD % (600, b"") + b"z" * 600)
    assert s.factory.body_bytes_held == 600  # held until answered
    c.connectionLost(None)
    assert s.factory.body_bytes_held == 0


def test_a_chunked_body_counts_against_the_budget_as_it_grows() -> None:
    s = Server(body_budget_bytes=10)
    proto, t = s.connect()
    proto.dataReceived(b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"8\r\n12345678\r\n8\r\n12345678\r\n")  # fmt: skip
    ((status, _, _),) = responses(t.value())
    assert status == 503 and t.disconnecting
    proto.connectionLost(None)
    assert s.factory.body_bytes_held == 0


def test_per_address_cap_refuses_the_next_connection_from_that_address_only() -> None:
    s = Server(max_connections_per_address=2)
    first, _ = s.connect()
    s.connect()
    refused, _ = s.connect()
    assert refused is None and s.factory.address_refusals == 1
    other, _ = s.connect("127.0.0.2")
    assert other is not None
    first.connectionLost(None)
    again, _ = s.connect()
    assert again is not None and s.factory.connections_from("127.0.0.1") == 2


def test_write_pause_stops_reading_and_dispatching_until_the_buffer_drains() -> None:
    """While the transport's buffer is over its mark (pauseProducing), pipelined
    requests wait and reading stops; resumeProducing answers them in order."""
    s = Server()
    proto, t = s.connect()
    assert t.producer is proto  # a non-TCP transport: flow control from the start
    proto.pauseProducing()
    assert t.producerState == "paused" and s.factory.write_pauses == 1
    proto.dataReceived(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
    assert s.app.dispatched == []
    proto.resumeProducing()
    assert s.app.dispatched == [b"/a", b"/b"] and t.producerState == "producing"
    assert len(responses(t.value())) == 2


def test_a_paused_stream_pauses_its_producer_and_one_without_is_cut() -> None:
    """A streamed answer's producer is paused with the connection; a stream with no
    producer that keeps writing while paused is cut after MAX_PAUSED_WRITE bytes."""
    s = Server()
    s.app.defer_next = True
    proto, t = s.connect()
    proto.dataReceived(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
    request = s.app.requests[0]

    class Producer:
        state = "producing"

        def pauseProducing(self) -> None:
            self.state = "paused"

        def resumeProducing(self) -> None:
            self.state = "producing"

    producer = Producer()
    request.registerProducer(producer, True)
    request.write(b"event\n")
    proto.pauseProducing()
    assert producer.state == "paused"
    proto.resumeProducing()
    assert producer.state == "producing"
    request.unregisterProducer()
    proto.pauseProducing()
    for _ in range(MAX_PAUSED_WRITE // 65536 + 2):
        request.write(b"e" * 65536)
    assert t.disconnected  # aborted


def test_head_on_a_streamed_answer_writes_no_chunk() -> None:
    s = Server()
    s.app.defer_next = True
    proto, t = s.connect()
    proto.dataReceived(b"HEAD /s HTTP/1.1\r\nHost: h\r\n\r\n")
    request = s.app.requests[0]
    request.write(b"data: x\n\n")
    s.app.pending[0].callback(b"last")
    out = t.value()
    assert out.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in out
    assert out.endswith(b"\r\n\r\n") and b"0\r\n\r\n" not in out.partition(b"\r\n\r\n")[2]
    assert not t.disconnecting  # and the connection stays usable


def test_an_answer_that_raises_while_written_closes_its_connection() -> None:
    """An exception while an answer is encoded is logged and closes the connection;
    the server never leaves it busy."""
    s = Server()
    s.app.bad_header = True
    proto, t = s.connect()
    proto.dataReceived(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    assert t.disconnected or t.disconnecting
    assert not proto._busy


def test_head_on_a_streamed_answer_ends_once_its_head_is_sent() -> None:
    """HEAD on a route that streams: the head is the whole answer; the stream's
    Deferred is cancelled (as for a client that left) and the connection goes on."""
    s = Server()
    s.app.defer_next = True
    proto, t = s.connect()
    proto.dataReceived(b"HEAD /s HTTP/1.1\r\nHost: h\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n")
    request = s.app.requests[0]
    request.write(b"data: x\n\n")  # the head goes out
    s.app.defer_next = False
    s.clock.advance(0)
    assert s.app.pending[0].called  # cancelled: the stream's source is released
    out = t.value()
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 200 ")
    assert s.app.dispatched == [b"/s", b"/next"] and not t.disconnecting


class BufferedTransport(StringTransport):
    """A StringTransport that, like Twisted's TCP transports, holds what the socket
    has not taken yet (``dataBuffer`` from ``offset``, plus ``_tempDataLen``)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0

    def write(self, data: bytes) -> None:
        super().write(data)
        self._tempDataLen += len(data)

    def client_reads(self, n: int) -> None:
        """The peer takes ``n`` bytes (the kernel sent them)."""
        self._tempDataLen -= n


def paused_pipeline(s: Server, transport: StringTransport | None = None) -> Any:
    """A connection paused by its writes with two pipelined GETs still queued."""
    proto = s.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    t = transport or StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    proto.makeConnection(t)
    s.factory.startFactory()
    proto.dataReceived(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n" * 3)
    return proto, t


def test_a_paused_connection_with_queued_requests_is_aborted_past_the_write_deadline() -> None:
    """A client that pipelines GETs and never reads: once its answers back up, the
    connection is aborted after the write deadline (the read deadline's value by
    default), although requests are queued (before: held open for ever)."""
    s = Server(read_timeout_s=4, idle_timeout_s=4)
    s.app.defer_next = True
    proto, t = paused_pipeline(s)
    proto.pauseProducing()  # the answer does not fit in the socket
    s.app.pending[0].callback(b"x" * 1000)
    assert s.app.dispatched == [b"/a"] and len(proto._queue) == 2
    s.clock.advance(3.5)
    assert not t.disconnected
    s.clock.advance(2.5)  # past 4 s paused, one sweep later
    assert t.disconnected and s.factory.write_timeouts == 1
    s.factory.stopFactory()


def test_a_client_that_reads_slowly_keeps_its_connection() -> None:
    """Each sweep that finds bytes taken since the last one restarts the write
    deadline: a slow reader is not a client that does not read."""
    s = Server(read_timeout_s=60, idle_timeout_s=60, write_timeout_s=4)
    s.app.defer_next = True
    t = BufferedTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    proto, _ = paused_pipeline(s, t)
    proto.pauseProducing()
    s.app.pending[0].callback(b"x" * 100_000)
    for _ in range(10):  # 20 s paused in all, some bytes read every 2 s
        s.clock.advance(2)
        t.client_reads(1000)
    assert not t.disconnected
    for _ in range(5):  # then nothing read for longer than the deadline (+ sweeps)
        s.clock.advance(2)
    assert t.disconnected and s.factory.write_timeouts == 1
    s.factory.stopFactory()


def test_a_streamed_answer_whose_client_does_not_read_is_aborted_too() -> None:
    """A stream with a producer (paused with the connection) to a client that never
    reads is aborted past the write deadline, and its producer's Deferred cancelled."""
    s = Server(read_timeout_s=4, idle_timeout_s=4)
    s.app.defer_next = True
    proto, t = s.connect()
    s.factory.startFactory()
    proto.dataReceived(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
    s.app.requests[0].write(b"event\n")
    proto.pauseProducing()
    s.clock.advance(6.5)
    assert t.disconnected
    proto.connectionLost(None)
    assert s.app.pending[0].called  # cancelled: the stream's source is released
    s.factory.stopFactory()


def test_heads_alone_reserve_none_of_the_body_budget() -> None:
    """Sixteen heads announcing the largest body reserve nothing: another client's
    POST is served (before: every byte of the budget was reserved by the heads and
    the POST was answered 503 until the read deadline)."""
    s = Server(body_budget_bytes=16 * 1000, max_body_bytes=1000)
    for _ in range(16):
        proto, t = s.connect()
        proto.dataReceived(POST_HEAD % (1000, b"Expect: 100-continue\r\n"))
        assert t.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert s.factory.body_bytes_held == 0
    other, to = s.connect()
    other.dataReceived(POST_HEAD % (10, b"") + b"y" * 10)
    assert responses(to.value())[0][:1] == (200,)


def test_body_bytes_are_reserved_as_they_arrive() -> None:
    """The budget holds the bytes read so far; a head whose length does not fit in
    what is free is a 503 from the head, and a body whose next bytes no longer fit
    is a 503 (Connection: close) as soon as they arrive; the bytes come back."""
    s = Server(body_budget_bytes=1000)
    a, ta = s.connect()
    a.dataReceived(POST_HEAD % (900, b"") + b"a" * 600)
    assert s.factory.body_bytes_held == 600
    late, tl = s.connect()
    late.dataReceived(POST_HEAD % (500, b""))  # 600 + 500 do not fit: from the head
    assert responses(tl.value())[0][0] == 503 and s.factory.body_bytes_held == 600
    b, tb = s.connect()
    b.dataReceived(POST_HEAD % (300, b"") + b"b" * 300)  # fits: answered
    assert responses(tb.value())[0][2] == b"300" and s.factory.body_bytes_held == 600
    s.app.defer_next = True
    c, _ = s.connect()
    c.dataReceived(POST_HEAD % (400, b"") + b"c" * 400)  # held until answered
    assert s.factory.body_bytes_held == 1000
    a.dataReceived(b"a" * 100)  # a's next bytes no longer fit
    ((status, headers, _),) = responses(ta.value())
    assert status == 503 and headers[b"retry-after"] == b"1" and ta.disconnecting
    a.connectionLost(None)
    c.connectionLost(None)
    assert s.factory.body_bytes_held == 0 and s.factory.budget_refusals == 2
