"""A lean pooled HTTP/1.1 client for the gateway's loopback hop (reactor thread).

The twisted ``Agent`` + ``HTTPConnectionPool`` costs ~170 µs of CPU per proxied poll
(Headers objects, producers, a state machine per response, several Deferreds); the
model ports speak a small, known HTTP/1.1, so this client does the minimum:

* one :class:`UpstreamConnection` (a ``Protocol``) per persistent TCP connection, one
  request in flight on it at a time, kept alive and returned to a per-(host, port)
  idle pool (LIFO, capped at ``max_idle_per_host``) once its response is complete;
* the request is one write (head + in-memory body, whatever its size);
* responses are framed by llhttp (``httptools.HttpResponseParser``, lenient flags
  off): ``Content-Length`` or ``Transfer-Encoding: chunked`` (trailers dropped);
  the connection is reused only when llhttp says keep-alive. A response framed by
  the connection's close (no length; the model server never sends one) is a 502.

Contract: :meth:`LeanUpstreamClient.request` fires with an
:class:`~.upstream.UpstreamResponse` or fails with :class:`~.upstream.UpstreamUnavailable`
(refused/unreachable, 503), :class:`~.upstream.UpstreamTimeout` (no complete response
within ``recv_timeout_s``, 504), :class:`~.upstream.UpstreamTransportError`
(connection lost, or anything llhttp refuses, or bytes after a complete response,
502), or ``CancelledError`` when the caller cancelled. A cancelled or timed-out
request aborts its connection: a half-used connection never goes back to the pool. A
GET whose *reused* connection turns out closed before any byte of the answer is
retried once on a fresh connection (the server's idle close racing our write).

**Streams** (a job's ``text/event-stream``): :meth:`LeanUpstreamClient.stream` sends
on a dedicated connection, never taken from nor returned to the pool, and hands the
body over as it arrives (:mod:`~mortred_twisted.http11.upstream_stream`).
"""

from __future__ import annotations

from typing import IO, Any

import httptools
from twisted.internet import defer, error
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure

from mortred_twisted.http11.transport import EagerWriter
from mortred_twisted.http11.upstream import (
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamTransportError,
    UpstreamUnavailable,
)

_UNAVAILABLE = (
    error.ConnectionRefusedError,
    error.ConnectError,
    error.DNSLookupError,
    error.NoRouteError,
)

#: Largest response head accepted (header fields), and most bytes read without
#: progress (a head, chunk-size line or trailer in pieces).
MAX_HEAD = 64 * 1024
#: A request body over this many bytes is sent after its head, a piece at a time at
#: the socket's pace (:class:`_BodySender`), never joined to its head: the bytes the
#: client sent are then the only copy the process holds (a large multipart upload).
LARGE_BODY = 256 * 1024
#: Bytes of a large body handed to the transport at a time.
BODY_PIECE = 64 * 1024
#: A request as encoded: one buffer, or (head, body) for a large body.
Encoded = bytes | tuple[bytes, bytes]


class _BodySender:
    """A large request body written to an upstream transport a piece at a time, as
    its streaming producer: Twisted pauses it above its buffer's high-water mark and
    resumes it once drained, so what Twisted holds is a piece or two, and the body
    itself is never copied whole (reactor thread)."""

    __slots__ = ("_at", "_paused", "_transport", "_view", "_write", "finished")

    def __init__(self, transport: Any, write: Any, body: bytes) -> None:
        self._transport = transport
        self._write = write
        self._view = memoryview(body)
        self._at = 0
        self._paused = False
        self.finished = False

    def start(self) -> None:
        self._transport.registerProducer(self, True)
        self.resumeProducing()

    def resumeProducing(self) -> None:
        self._paused = False
        view = self._view
        while not self._paused and not self.finished:
            piece = view[self._at : self._at + BODY_PIECE]
            if not len(piece):
                self.stop()
                return
            self._at += len(piece)
            self._write(bytes(piece))  # one piece's copy; may pause us at once

    def pauseProducing(self) -> None:
        self._paused = True

    def stopProducing(self) -> None:
        """The transport is going away."""
        self.finished = True

    def stop(self) -> None:
        """Done (or no longer wanted): write no more and let the transport go."""
        if not self.finished:
            self.finished = True
            if self._transport.producer is self:
                self._transport.unregisterProducer()


class UpstreamProtocolError(Exception):
    """The upstream sent something this client cannot frame."""


class _Stop(Exception):
    """Raised in a parser callback to stop parsing."""


class RawHeaders:
    """Response headers as received, with the two ``Headers`` read methods the
    gateway uses (``getAllRawHeaders`` groups repeated names; lookups ignore case)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.pairs = pairs

    def getAllRawHeaders(self) -> list[tuple[bytes, list[bytes]]]:
        grouped: dict[bytes, tuple[bytes, list[bytes]]] = {}
        for name, value in self.pairs:
            entry = grouped.get(name.lower())
            if entry is None:
                grouped[name.lower()] = (name, [value])
            else:
                entry[1].append(value)
        return list(grouped.values())

    def getRawHeaders(self, name: bytes | str, default: Any = None) -> list[bytes] | Any:
        key = (name.encode("ascii") if isinstance(name, str) else name).lower()
        found = [v for n, v in self.pairs if n.lower() == key]
        return found or default


class _Exchange:
    """One request/response on a connection: the caller's Deferred and its parse."""

    __slots__ = ("deferred", "got_bytes", "head", "retry")

    def __init__(
        self, deferred: defer.Deferred[UpstreamResponse], retry: Any, head: bool = False
    ) -> None:
        self.deferred = deferred
        self.got_bytes = False
        #: a zero-argument callable resending on a new connection, or None
        self.retry = retry
        #: a HEAD request: its response has no body whatever its head says
        self.head = head


class UpstreamConnection(Protocol):
    """One persistent loopback connection; parses one response at a time.

    ``on_idle(conn)`` is called when a response completed and the connection may be
    reused; ``on_lost(conn)`` when the connection is gone (pool bookkeeping).
    """

    def __init__(self, key: tuple[str, int], on_idle: Any, on_lost: Any) -> None:
        self.key = key
        self._on_idle = on_idle
        self._on_lost = on_lost
        self.exchange: _Exchange | None = None
        self._sender: _BodySender | None = None
        self.reused = False
        self.lost = False
        self._writer: EagerWriter | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self._code = 0
        self._headers: list[tuple[bytes, bytes]] | None = None
        self._pairs: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._reads = 0
        self._chunks: list[bytes] = []
        self._done = False  # the response is complete
        self._keep = False  # llhttp's keep-alive verdict on the complete response
        self._after = False  # bytes followed the complete response
        self._problem: str | None = None

    def connectionMade(self) -> None:
        self._writer = EagerWriter(self.transport)

    # -- sending ---------------------------------------------------------------------

    def send(self, data: Encoded, exchange: _Exchange) -> None:
        self.exchange = exchange
        self._reset()
        writer = self._writer
        assert writer is not None
        if type(data) is bytes:
            writer.write(data)
            return
        head, body = data
        writer.through_transport()  # the sender's pieces and ours stay in order
        writer.write(head)
        self._sender = _BodySender(self.transport, writer.write, body)
        self._sender.start()

    def _stop_sending(self) -> bool:
        """Stop a large body still being sent; whether one was (the connection
        cannot then be reused: the upstream answered before it read it all)."""
        sender, self._sender = self._sender, None
        if sender is None:
            return False
        unfinished = not sender.finished
        sender.stop()
        return unfinished

    def abort(self) -> None:
        """Drop the connection now (cancel, deadline): it never returns to the pool."""
        self.exchange = None
        self.lost = True
        if self.transport is not None:
            self.transport.abortConnection()

    # -- parser callbacks (llhttp, through httptools) ---------------------------------

    def on_message_begin(self) -> None:
        if self._done:
            self._after = True
            raise _Stop()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            self._problem = "response head too large"
            raise _Stop()
        if self._headers is None:
            self._pairs.append((name, value))
        # else: a trailer field, dropped

    def on_headers_complete(self) -> None:
        code = self._parser.get_status_code()
        if code < 200:
            self._problem = f"unexpected {code} response"
            raise _Stop()
        self._code = code
        self._headers = self._pairs
        self._reads = 0
        ex = self.exchange
        if ex is not None and ex.head:
            self._done = True
            self._after = True  # llhttp would wait for the body: never reuse
            raise _Stop()

    def on_body(self, data: bytes) -> None:
        self._reads = 0
        self._chunks.append(data)

    def on_chunk_header(self) -> None:
        self._reads = 0

    def on_message_complete(self) -> None:
        self._done = True
        self._keep = self._parser.should_keep_alive()  # llhttp resets it afterwards

    # -- receiving -------------------------------------------------------------------

    def _feed(self, data: bytes) -> bool:
        """Give ``data`` to llhttp, recording why it stopped in ``_problem``; True
        when llhttp refused the bytes (a parse error)."""
        self._reads += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            # _Stop: the reason is in _done/_after/_problem (else a callback's bug)
            if not self._done and self._problem is None:
                self._problem = "response parser callback failed"
        except httptools.HttpParserError as exc:
            if not self._done:
                self._problem = f"bad response: {exc}"
            return True
        return False

    def dataReceived(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            # Bytes nobody asked for: the connection is out of sync; drop it.
            self.abort()
            return
        ex.got_bytes = True
        if self._feed(data):
            self._after = True
        if self._done:
            if self._after and not ex.head:
                self._fail(UpstreamProtocolError("bytes after the response"))
            else:
                self._complete(keep=self._keep and not self._after)
        elif self._problem is not None:
            self._fail(UpstreamProtocolError(self._problem))
        elif self._reads > MAX_HEAD + 65536:
            self._fail(UpstreamProtocolError("response framing too large"))

    def _complete(self, keep: bool) -> None:
        ex = self.exchange
        assert ex is not None and self._headers is not None
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        response = UpstreamResponse(self._code, RawHeaders(self._headers), body)
        self.exchange = None
        self._reset()  # an idle connection holds no response bytes
        if self._stop_sending():
            keep = False  # answered before its body was all sent: never reused
        if keep:
            self.reused = True
            self._on_idle(self)
        else:
            self.lost = True
            assert self.transport is not None
            self.transport.loseConnection()
        ex.deferred.callback(response)

    def _fail(self, exc: Exception) -> None:
        ex = self.exchange
        self.abort()
        if ex is not None:
            ex.deferred.errback(UpstreamTransportError(f"upstream transport failure: {exc}"))

    def connectionLost(self, reason: Failure = error.ConnectionDone) -> None:  # type: ignore[assignment]
        self.lost = True
        self._stop_sending()
        self._on_lost(self)
        ex = self.exchange
        self.exchange = None
        if ex is None:
            return
        if not ex.got_bytes and self.reused and ex.retry is not None:
            ex.retry()
            return
        message = reason.getErrorMessage() if isinstance(reason, Failure) else str(reason)
        ex.deferred.errback(
            UpstreamTransportError(f"upstream transport failure: connection lost ({message})")
        )


class _ConnectFactory(ClientFactory):
    noisy = False

    def __init__(self, conn: UpstreamConnection, ready: defer.Deferred[UpstreamConnection]):
        self._conn = conn
        self._ready = ready

    def buildProtocol(self, addr: Any) -> UpstreamConnection:
        return self._conn

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self._ready.called:
            self._ready.errback(reason)


class _ReadyConnection(UpstreamConnection):
    ready: defer.Deferred[UpstreamConnection] | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)  # requests are single writes: never wait for an ACK
        ready, self.ready = self.ready, None
        if ready is not None and not ready.called:
            ready.callback(self)


class _Call:
    """One forwarded request: its Deferred, connection, deadline and retry state."""

    __slots__ = (
        "_client",
        "_conn",
        "_connecting",
        "_data",
        "_head",
        "_key",
        "_timed_out",
        "_timer",
        "deferred",
    )  # fmt: skip

    def __init__(
        self, client: LeanUpstreamClient, key: tuple[str, int], data: Encoded, method: str
    ) -> None:
        self._client = client
        self._head = method == "HEAD"
        self._key = key
        self._data = data
        self._conn: UpstreamConnection | None = None
        self._connecting: defer.Deferred[UpstreamConnection] | None = None
        self._timed_out = False
        self.deferred: defer.Deferred[UpstreamResponse] = defer.Deferred(self._cancel)
        self._start(method == "GET")
        self._timer = client._clock.callLater(client.recv_timeout_s, self._on_deadline)
        self.deferred.addBoth(self._done)

    def _start(self, allow_retry: bool) -> None:
        idle = self._client._idle.get(self._key)
        if idle:
            self._send(idle.pop(), allow_retry)
            return
        connecting = self._connecting = self._client._connect(self._key)
        connecting.addCallbacks(self._send, self._connect_failed, callbackArgs=(False,))

    def _retry(self) -> None:
        self._start(False)

    def _send(self, conn: UpstreamConnection, allow_retry: bool) -> None:
        self._connecting = None
        if self.deferred.called:  # cancelled while connecting
            conn.abort()
            return
        self._conn = conn
        retry = self._retry if allow_retry else None
        conn.send(self._data, _Exchange(self.deferred, retry, self._head))

    def _connect_failed(self, failure: Failure) -> None:
        self._connecting = None
        d = self.deferred
        if d.called or failure.check(defer.CancelledError):
            return  # cancelled by d's canceller: d fails with CancelledError
        if failure.check(*_UNAVAILABLE):
            d.errback(UpstreamUnavailable(f"model not running ({failure.value})"))
        else:
            message = failure.getErrorMessage() or failure.type.__name__  # type: ignore[union-attr]
            d.errback(UpstreamTransportError(f"upstream transport failure: {message}"))

    def _cancel(self, _: Any) -> None:
        connecting = self._connecting
        if connecting is not None and not connecting.called:
            connecting.cancel()
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abort()

    def _on_deadline(self) -> None:
        self._timed_out = True
        self.deferred.cancel()

    def _done(self, result: Any) -> Any:
        timer = self._timer
        if timer.active():
            timer.cancel()
        self._conn = None
        if self._timed_out and isinstance(result, Failure):
            raise UpstreamTimeout(
                f"upstream did not answer within {self._client.recv_timeout_s * 1000:.0f} ms"
            )
        return result


#: Upstream origins whose parsed form :class:`LeanUpstreamClient` keeps, and the
#: longest one kept (catalog upstreams: a handful of short ``host:port``).
MAX_ORIGINS = 1024
MAX_ORIGIN_LENGTH = 300


class LeanUpstreamClient:
    """Forwards a request over pooled keep-alive connections (see module docstring).

    :param reactor: ``IReactorTCP`` + ``IReactorTime`` (or a ``MemoryReactorClock``).
    """

    def __init__(
        self,
        reactor: Any,
        *,
        recv_timeout_s: float,
        connect_timeout_s: float = 30.0,
        max_idle_per_host: int = 64,
    ) -> None:
        self._reactor = reactor
        self._clock: IReactorTime = reactor
        self.recv_timeout_s = recv_timeout_s
        self._connect_timeout = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        #: ``host:port`` of an upstream URL -> its connection key and Host value
        self._origins: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._all: set[UpstreamConnection] = set()

    # -- pool ------------------------------------------------------------------------

    def idle_count(self, host: str, port: int) -> int:
        return len(self._idle.get((host, port), ()))

    def _on_idle(self, conn: UpstreamConnection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle_per_host:
            conn.abort()
            return
        idle.append(conn)

    def _on_lost(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _connect(
        self, key: tuple[str, int], kind: type[_ReadyConnection] | None = None
    ) -> defer.Deferred[UpstreamConnection]:
        ready: defer.Deferred[UpstreamConnection] = defer.Deferred()
        conn = (kind or _ReadyConnection)(key, self._on_idle, self._on_lost)
        conn.ready = ready
        connector = self._reactor.connectTCP(
            key[0], key[1], _ConnectFactory(conn, ready), timeout=self._connect_timeout
        )
        self._all.add(conn)

        def cancel_connect(_: Any) -> None:
            connector.disconnect()

        ready.addErrback(self._connect_failed, conn, cancel_connect)
        return ready

    def _connect_failed(self, failure: Failure, conn: UpstreamConnection, stop: Any) -> Any:
        self._all.discard(conn)
        if failure.check(defer.CancelledError):
            stop(None)
        return failure

    def _split(self, url: str) -> tuple[tuple[str, int], bytes, bytes]:
        """``(host, port)``, the ``Host`` value and the request target of ``url``.

        Only the origin's part is cached, keyed by the origin (``host:port``): the
        upstreams a gateway forwards to are a handful, while the path and query
        come from callers (a wait query, a listing cursor) and are never kept, so
        distinct URLs cannot grow the cache. At most :data:`MAX_ORIGINS` origins of
        at most :data:`MAX_ORIGIN_LENGTH` characters are kept."""
        start = url.find("://") + 3
        slash = url.find("/", start)
        if slash < 0:
            hostport, target = url[start:], b"/"
        else:
            hostport, target = url[start:slash], url[slash:].encode("ascii")
        origin = self._origins.get(hostport)
        if origin is None:
            host, _, port = hostport.rpartition(":")
            if not host:
                host, port = hostport, "80"
            origin = ((host.strip("[]"), int(port)), hostport.encode("ascii"))
            if len(self._origins) < MAX_ORIGINS and len(hostport) <= MAX_ORIGIN_LENGTH:
                self._origins[hostport] = origin
        return origin[0], origin[1], target

    # -- requests --------------------------------------------------------------------

    def body_for(self, content: IO[bytes] | None, length: int) -> bytes | None:
        """The body to forward, as bytes (sent with the head in one write)."""
        if content is None or length <= 0:
            return None
        content.seek(0)
        return content.read()

    def request(
        self,
        method: str,
        url: str,
        headers: dict[bytes, list[bytes]],
        body: bytes | None = None,
    ) -> defer.Deferred[UpstreamResponse]:
        """Send and read the whole response (see the module docstring for failures)."""
        key, data = self._encode(method, url, headers, body)
        return _Call(self, key, data, method).deferred

    def stream(
        self, method: str, url: str, headers: dict[bytes, list[bytes]]
    ) -> defer.Deferred[Any]:
        """Send on a dedicated connection; fires with the response head as an
        :class:`~mortred_twisted.http11.upstream_stream.UpstreamStream`."""
        from mortred_twisted.http11.upstream_stream import StreamCall  # uses this module

        key, data = self._encode(method, url, headers, None)
        return StreamCall(self, key, data, method).deferred

    def _encode(
        self, method: str, url: str, headers: dict[bytes, list[bytes]], body: bytes | None
    ) -> tuple[tuple[str, int], Encoded]:
        key, host, path = self._split(url)
        parts = [method.encode("ascii"), b" ", path, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
        for name, values in headers.items():
            for value in values:
                parts += (name, b": ", value, b"\r\n")
        if body is not None and len(body) > LARGE_BODY:  # sent after its head, never joined
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n\r\n")
            return key, (b"".join(parts), body)
        if body is not None:
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n\r\n", body)
        elif method != "GET" and method != "HEAD":
            parts.append(b"content-length: 0\r\n\r\n")
        else:
            parts.append(b"\r\n")
        return key, b"".join(parts)

    def close(self) -> defer.Deferred[None]:
        """Close every connection (service shutdown)."""
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        return defer.succeed(None)
