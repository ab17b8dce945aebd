"""Streamed upstream responses for the gateway (a job's event stream; reactor thread).

:meth:`~mortred_twisted.http11.pool.LeanUpstreamClient.stream` sends the request on
a dedicated connection (a :class:`StreamingConnection`), never taken from nor
returned to the keep-alive pool (so the hot path's code and pool are untouched, and
a connection can never go back to the pool mid-stream), and fires with an
:class:`UpstreamStream` once the response head is in: until then the failures and
limits are the pool's (``UpstreamUnavailable`` when refused, ``UpstreamTimeout``
when no head came within ``recv_timeout_s``, ``UpstreamTransportError`` otherwise;
cancelling aborts). Then the body is handed over piece by piece as it arrives, and
the stream's ``done``:

* fires with None when the body is complete (the connection is then closed);
* fails with :class:`~.upstream.UpstreamTransportError` (connection lost, framing
  llhttp refuses) or :class:`~.upstream.UpstreamTimeout` (nothing arrived for
  :func:`stream_idle_s`);
* cancelled (the client left), aborts the connection, which ends the model's stream.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, error
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from mortred_twisted.http11.pool import (
    MAX_HEAD,
    RawHeaders,
    UpstreamConnection,
    UpstreamProtocolError,
    _Call,
    _ReadyConnection,
)
from mortred_twisted.http11.upstream import UpstreamTimeout, UpstreamTransportError

#: Least silence (s) after which a stream whose upstream sent nothing is cut: the
#: model server writes a ``: ping`` every 15 s, so this means the upstream is gone.
STREAM_IDLE_MIN_S = 60.0


def stream_idle_s(recv_timeout_s: float) -> float:
    """How long a stream may stay silent: ``recv_timeout_s``, at least
    :data:`STREAM_IDLE_MIN_S`."""
    return max(recv_timeout_s, STREAM_IDLE_MIN_S)


class UpstreamStream:
    """A streamed response: ``code`` and ``headers`` now, the body as it arrives.

    :meth:`start` names the sink that gets every body piece (those that arrived
    before are handed over at once, in one call); :meth:`read_all` reads the whole
    body instead (an answer that is not a stream: an error). ``done`` fires with None
    when the body is complete, or fails (module docstring); cancelling it aborts the
    connection. Reactor thread only.
    """

    __slots__ = (
        "_clock", "_conn", "_held", "_idle", "_idle_s", "_paused", "_sink", "code", "done",
        "headers",
    )  # fmt: skip

    def __init__(
        self, code: int, headers: RawHeaders, conn: StreamingConnection, clock: IReactorTime,
        idle_s: float,
    ) -> None:  # fmt: skip
        self.code = code
        self.headers = headers
        self._conn = conn
        self._sink: Any = None
        self._held: list[bytes] = []
        self._idle_s = idle_s
        self._clock = clock
        self._paused = False
        self._idle: IDelayedCall | None = clock.callLater(idle_s, self._silent)
        self.done: defer.Deferred[None] = defer.Deferred(self._cancel)

    # -- IPushProducer: the client's write flow control pauses the upstream ---------

    def pauseProducing(self) -> None:
        """The client does not read: stop reading the upstream (its own buffers then
        fill and the model's writes wait), and stop counting its silence."""
        if self._paused or self.done.called:
            return
        self._paused = True
        idle, self._idle = self._idle, None
        if idle is not None and idle.active():
            idle.cancel()
        transport = self._conn.transport
        if transport is not None:
            transport.pauseProducing()

    def resumeProducing(self) -> None:
        if not self._paused or self.done.called:
            return
        self._paused = False
        self._idle = self._clock.callLater(self._idle_s, self._silent)
        transport = self._conn.transport
        if transport is not None:
            transport.resumeProducing()

    def stopProducing(self) -> None:
        self.close()

    def start(self, sink: Any) -> None:
        """Hand every body piece to ``sink(bytes)`` from now on."""
        self._sink = sink
        if self._held:
            held, self._held = self._held, []
            sink(b"".join(held))

    def read_all(self) -> defer.Deferred[bytes]:
        """The whole body, once complete (fails like ``done``)."""
        parts: list[bytes] = []
        self.start(parts.append)
        return self.done.addCallback(lambda _: b"".join(parts))

    def close(self) -> None:
        """Abort the connection (``done`` fails with ``CancelledError``)."""
        self.done.cancel()

    def _feed(self, data: bytes) -> None:
        idle = self._idle
        if idle is not None and idle.active():
            idle.reset(self._idle_s)
        if self._sink is not None:
            self._sink(data)
        else:
            self._held.append(data)

    def _end(self, exc: Exception | None) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and idle.active():
            idle.cancel()
        if self.done.called:
            return
        if exc is None:
            self.done.callback(None)
        else:
            self.done.errback(exc)

    def _silent(self) -> None:
        self._idle = None
        self._conn.abort()
        self._end(UpstreamTimeout(f"upstream stream silent for {self._idle_s:.0f} s"))

    def _cancel(self, _: Any) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and idle.active():
            idle.cancel()
        self._conn.abort()


class StreamingConnection(_ReadyConnection):
    """A dedicated connection for one streamed response: never pooled, closed when
    the response ends. Until the head is in it behaves like a pooled connection
    (same limits and failures); then every body piece goes to its
    :class:`UpstreamStream`."""

    stream: UpstreamStream | None = None
    clock: IReactorTime
    idle_s = STREAM_IDLE_MIN_S

    def dataReceived(self, data: bytes) -> None:
        stream = self.stream
        ex = self.exchange
        if stream is None and ex is None:
            self.abort()  # nobody waits for these bytes (cancelled)
            return
        if ex is not None:
            ex.got_bytes = True
        self._feed(data)
        if stream is None:
            if self._headers is None or self._problem is not None:
                if self._problem is not None:
                    self._fail(UpstreamProtocolError(self._problem))
                elif self._reads > MAX_HEAD + 65536:
                    self._fail(UpstreamProtocolError("response framing too large"))
                return
            assert ex is not None
            stream = self.stream = UpstreamStream(
                self._code, RawHeaders(self._headers), self, self.clock, self.idle_s
            )
            self.exchange = None
            ex.deferred.callback(stream)  # the caller names its sink here
            if self.lost:
                return
        chunks = self._chunks
        if chunks:
            self._chunks = []
            stream._feed(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if self._done:
            self.lost = True
            assert self.transport is not None
            self.transport.loseConnection()
            stream._end(None)
        elif self._problem is not None:
            self.abort()
            stream._end(UpstreamTransportError(f"upstream transport failure: {self._problem}"))
        elif self._reads > MAX_HEAD + 65536:
            self.abort()
            stream._end(UpstreamTransportError("upstream transport failure: framing too large"))

    def connectionLost(self, reason: Failure = error.ConnectionDone) -> None:  # type: ignore[assignment]
        stream = self.stream
        super().connectionLost(reason)
        if stream is not None and not self._done:
            message = reason.getErrorMessage() if isinstance(reason, Failure) else str(reason)
            stream._end(
                UpstreamTransportError(f"upstream transport failure: connection lost ({message})")
            )


class StreamCall(_Call):
    """A :class:`_Call` on a fresh :class:`StreamingConnection`; its Deferred fires
    with the :class:`UpstreamStream` once the head is in."""

    __slots__ = ()

    def _start(self, allow_retry: bool) -> None:
        connecting = self._connecting = self._client._connect(self._key, StreamingConnection)
        connecting.addCallbacks(self._send, self._connect_failed, callbackArgs=(False,))

    def _send(self, conn: UpstreamConnection, allow_retry: bool) -> None:
        assert isinstance(conn, StreamingConnection)
        conn.clock = self._client._clock
        conn.idle_s = stream_idle_s(self._client.recv_timeout_s)
        super()._send(conn, False)


def declared_length(stream: UpstreamStream) -> int | None:
    """The upstream answer's ``Content-Length`` (None: chunked, or not one number)."""
    values = stream.headers.getRawHeaders(b"content-length")
    if not values or len(values) != 1 or not values[0].isdigit() or len(values[0]) > 19:
        return None
    return int(values[0])


def relay_body(stream: UpstreamStream, request: Any) -> defer.Deferred[bytes]:
    """Relay the body of ``stream`` to ``request`` as it arrives, at the client's pace
    (the stream is the request's producer: a client that does not read pauses the
    upstream socket, so the relay holds a read or two, never the body). Framed by
    the upstream's ``Content-Length`` when it has one (else chunked). The Deferred
    fires with ``b""`` when the body is complete and fails like ``stream.done``
    (before any byte was sent, with the declaration taken back);
    cancelled (the client left), it aborts the upstream connection."""
    length = declared_length(stream)
    if length is not None:
        request.declare_length(length)
    request.registerProducer(stream, True)

    def ended(result: Any) -> Any:
        request.unregisterProducer()
        if length is not None and isinstance(result, Failure) and not request.started:
            request.declare_length(None)  # nothing sent: the caller answers otherwise
        return result

    stream.start(request.write)
    return stream.done.addBoth(ended).addCallback(lambda _: b"")
