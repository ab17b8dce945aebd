"""A lean pooled HTTP/1.1 client for the gateway's loopback hop (reactor thread).

The twisted ``Agent`` + ``HTTPConnectionPool`` costs ~170 µs of CPU per proxied poll
(Headers objects, producers, a state machine per response, several Deferreds); the
model ports speak a small, known HTTP/1.1, so this client does the minimum:

* one :class:`UpstreamConnection` (a ``Protocol``) per persistent TCP connection, one
  request in flight on it at a time, kept alive and returned to a per-(host, port)
  idle pool (LIFO, capped at ``max_idle_per_host``) once its response is complete;
* the request is one ``transport.write`` (head + in-memory body);
* responses are framed by ``Content-Length`` (what the model server sends), with
  ``Transfer-Encoding: chunked`` and read-to-close understood as fallbacks; a
  ``Connection: close`` answer is delivered and its connection is not reused.

Contract (the same as :class:`~.upstream.UpstreamClient`, which it wraps for streamed
bodies): :meth:`LeanUpstreamClient.request` fires with an :class:`UpstreamResponse`
or fails with :class:`UpstreamUnavailable` (refused/unreachable, 503),
:class:`UpstreamTimeout` (no complete response within ``recv_timeout_s``, 504),
:class:`UpstreamTransportError` (connection lost or garbage, 502), or
``CancelledError`` when the caller cancelled. A cancelled or timed-out request aborts
its connection: a half-used connection never goes back to the pool. A GET whose
*reused* connection turns out closed before any byte of the answer is retried once on
a fresh connection (the server's idle close racing our write).
"""

from __future__ import annotations

from typing import IO, Any

from twisted.internet import defer, error
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer

from mortred_twisted.gateway.transport import eager_write
from mortred_twisted.gateway.upstream import (
    STREAM_THRESHOLD,
    UpstreamClient,
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

#: Largest response head accepted (status line + headers).
MAX_HEAD = 64 * 1024


class UpstreamProtocolError(Exception):
    """The upstream sent something this client cannot frame."""


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

    __slots__ = ("deferred", "got_bytes", "retry")

    def __init__(self, deferred: defer.Deferred[UpstreamResponse], retry: Any) -> None:
        self.deferred = deferred
        self.got_bytes = False
        #: a zero-argument callable resending on a new connection, or None
        self.retry = retry


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
        self.reused = False
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self._buf = b""
        self._code = 0
        self._headers: list[tuple[bytes, bytes]] | None = None
        self._length = -1  # -1: unknown (read to close); -2: chunked
        self._close = False
        self._chunks: list[bytes] = []
        self._have = 0
        self._cbuf = bytearray()

    # -- sending ---------------------------------------------------------------------

    def send(self, data: bytes, exchange: _Exchange) -> None:
        self.exchange = exchange
        self._reset()
        eager_write(self.transport, data)

    def abort(self) -> None:
        """Drop the connection now (cancel, deadline): it never returns to the pool."""
        self.exchange = None
        self.lost = True
        if self.transport is not None:
            self.transport.abortConnection()

    # -- receiving -------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            # Bytes nobody asked for: the connection is out of sync; drop it.
            self.abort()
            return
        ex.got_bytes = True
        if self._headers is None:
            buf = self._buf + data if self._buf else data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._fail(UpstreamProtocolError("response head too large"))
                else:
                    self._buf = buf
                return
            self._buf = b""
            try:
                self._parse_head(buf[:end])
            except (ValueError, UpstreamProtocolError) as exc:
                self._fail(UpstreamProtocolError(f"bad response head: {exc}"))
                return
            data = buf[end + 4 :]
        # Body bytes: collected in a list (linear in the body size, however it is cut).
        length = self._length
        if length >= 0:
            have = self._have + len(data)
            if have < length:
                self._chunks.append(data)
                self._have = have
                return
            if have > length:
                self._fail(UpstreamProtocolError("bytes after the response body"))
                return
            if self._chunks:
                self._chunks.append(data)
                data = b"".join(self._chunks)
            self._complete(data)
            return
        if length == -2:
            self._cbuf += data
            self._chunked()
            return
        self._chunks.append(data)  # read to close

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1."):
            raise UpstreamProtocolError(repr(lines[0][:80]))
        self._code = code = int(status[1])
        headers: list[tuple[bytes, bytes]] = []
        length = -1
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise UpstreamProtocolError("header line without ':'")
            value = value.strip()
            lower = name.lower()
            if lower == b"content-length":
                length = int(value)
                if length < 0:
                    raise UpstreamProtocolError("negative Content-Length")
            elif lower == b"transfer-encoding":
                if value.lower() != b"chunked":
                    raise UpstreamProtocolError(f"transfer-encoding {value!r}")
                length = -2
            elif lower == b"connection" and value.lower() == b"close":
                self._close = True
            headers.append((name, value))
        if lines[0].startswith(b"HTTP/1.0"):
            self._close = True
        if code == 204 or code == 304 or 100 <= code < 200:
            length = 0
        if code < 200:
            raise UpstreamProtocolError("1xx responses are not expected")
        if length == -1:
            self._close = True
        self._headers = headers
        self._length = length

    def _chunked(self) -> None:
        buf = self._cbuf
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                return
            try:
                size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
            except ValueError:
                self._fail(UpstreamProtocolError("bad chunk size"))
                return
            if size == 0:
                # Last chunk; no trailers expected: "0\r\n\r\n".
                if buf.find(b"\r\n\r\n", eol - 2 if eol >= 2 else 0) < 0:
                    return
                self._complete(b"".join(self._chunks))
                return
            start = eol + 2
            if len(buf) < start + size + 2:
                return
            self._chunks.append(bytes(buf[start : start + size]))
            del buf[: start + size + 2]

    def _complete(self, body: bytes) -> None:
        ex = self.exchange
        assert ex is not None and self._headers is not None
        response = UpstreamResponse(self._code, RawHeaders(self._headers), body)
        self.exchange = None
        close = self._close
        self._reset()  # an idle connection holds no response bytes
        if close:
            self.lost = True
            assert self.transport is not None
            self.transport.loseConnection()
        else:
            self.reused = True
            self._on_idle(self)
        ex.deferred.callback(response)

    def _fail(self, exc: Exception) -> None:
        ex = self.exchange
        self.abort()
        if ex is not None:
            ex.deferred.errback(UpstreamTransportError(f"upstream transport failure: {exc}"))

    def connectionLost(self, reason: Failure = error.ConnectionDone) -> None:  # type: ignore[assignment]
        self.lost = True
        self._on_lost(self)
        ex = self.exchange
        self.exchange = None
        if ex is None:
            return
        if self._headers is not None and self._length == -1:
            body = b"".join(self._chunks)
            ex.deferred.callback(UpstreamResponse(self._code, RawHeaders(self._headers), body))
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
        "_key",
        "_timed_out",
        "_timer",
        "deferred",
    )  # fmt: skip

    def __init__(
        self, client: LeanUpstreamClient, key: tuple[str, int], data: bytes, retry: bool
    ) -> None:
        self._client = client
        self._key = key
        self._data = data
        self._conn: UpstreamConnection | None = None
        self._connecting: defer.Deferred[UpstreamConnection] | None = None
        self._timed_out = False
        self.deferred: defer.Deferred[UpstreamResponse] = defer.Deferred(self._cancel)
        self._start(retry)
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
        conn.send(self._data, _Exchange(self.deferred, self._retry if allow_retry else None))

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


class LeanUpstreamClient:
    """Forwards a request over pooled keep-alive connections (see module docstring).

    :param reactor: ``IReactorTCP`` + ``IReactorTime`` (or a ``MemoryReactorClock``).
    :param fallback: the Agent-based client used for streamed (large) bodies.
    """

    def __init__(
        self,
        reactor: Any,
        *,
        recv_timeout_s: float,
        connect_timeout_s: float = 30.0,
        max_idle_per_host: int = 64,
        fallback: UpstreamClient | None = None,
    ) -> None:
        self._reactor = reactor
        self._clock: IReactorTime = reactor
        self.recv_timeout_s = recv_timeout_s
        self._connect_timeout = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._fallback = fallback
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._parsed: dict[str, tuple[tuple[str, int], bytes, bytes]] = {}
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

    def _connect(self, key: tuple[str, int]) -> defer.Deferred[UpstreamConnection]:
        ready: defer.Deferred[UpstreamConnection] = defer.Deferred()
        conn = _ReadyConnection(key, self._on_idle, self._on_lost)
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
        parsed = self._parsed.get(url)
        if parsed is not None:
            return parsed
        rest = url.partition("://")[2]
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.rpartition(":")
        if not host:
            host, port = hostport, "80"
        key = (host.strip("[]"), int(port))
        parsed = (key, hostport.encode("ascii"), ("/" + path).encode("ascii"))
        if len(self._parsed) < 10000:
            self._parsed[url] = parsed
        return parsed

    # -- requests --------------------------------------------------------------------

    def body_for(self, content: IO[bytes] | None, length: int) -> IBodyProducer | bytes | None:
        """The body to forward: bytes when small (sent in one write), else a streamed
        producer (forwarded by the fallback Agent client)."""
        if content is None or length <= 0:
            return None
        if length <= STREAM_THRESHOLD or self._fallback is None:
            content.seek(0)
            return content.read()
        return self._fallback.body_for(content, length)

    def request(
        self,
        method: str,
        url: str,
        headers: dict[bytes, list[bytes]],
        body: IBodyProducer | bytes | None = None,
    ) -> defer.Deferred[UpstreamResponse]:
        """Send and read the whole response (see the module docstring for failures)."""
        if body is not None and not isinstance(body, bytes):
            if self._fallback is None:
                raise TypeError("streamed bodies need a fallback client")
            return self._fallback.request(method, url, headers, body)
        key, host, path = self._split(url)
        parts = [method.encode("ascii"), b" ", path, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
        for name, values in headers.items():
            for value in values:
                parts += (name, b": ", value, b"\r\n")
        if body is not None:
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n\r\n", body)
        elif method != "GET" and method != "HEAD":
            parts.append(b"content-length: 0\r\n\r\n")
        else:
            parts.append(b"\r\n")
        data = b"".join(parts)

        return _Call(self, key, data, method == "GET").deferred

    def close(self) -> defer.Deferred[None]:
        """Close every connection (service shutdown), and the fallback's pool."""
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        if self._fallback is not None:
            return self._fallback.close()
        return defer.succeed(None)
