"""The gateway's HTTP/1.1 server: a lean protocol in place of twisted.web (edge).

Why not twisted.web: per proxied request it parses the head line by line through
``LineReceiver``, builds a ``Request`` and two ``Headers``, pauses and resumes the
transport around the request (two ``epoll_ctl``), writes the answer through a dozen
header writes into a buffered transport (a writer registration and one more reactor
round before the bytes leave) and fires several Deferreds; on the poll path that was
about half of the gateway's CPU, and the gateway's CPU is what bounds its
throughput (``docs/benchmarks.md``). The gateway's decisions all live in
:meth:`~mortred_twisted.http.gateway.GatewayApp.dispatch`; this module frames
requests and responses and hands ``dispatch`` a :class:`ProxyRequest` (the subset of
``IRequest`` it reads and writes).

Contract (one :class:`GatewayConnection` per TCP connection, reactor thread only):

* HTTP/1.1 keep-alive (HTTP/1.0: only with ``Connection: keep-alive``);
  ``Connection: close`` is honoured and echoed. Pipelined requests are answered in
  order, one at a time; reading pauses while more than :data:`MAX_PIPELINED` bytes
  wait behind the request in progress.
* Request bodies framed by ``Content-Length`` or ``Transfer-Encoding: chunked``
  (decoded; trailers dropped); both at once, an invalid or conflicting length, or
  another transfer coding is 400, and the connection closes.
* A body over ``max_body_bytes`` (declared, or while a chunked body grows) is answered
  ``413`` as soon as that is known, with ``Connection: close``; no ``100 Continue``
  is sent, the rest is not read and no route runs. ``Expect: 100-continue`` is
  otherwise answered ``100 Continue`` once the head is accepted.
* A head over :data:`MAX_HEAD` bytes is 431; a malformed head is 400 (including a
  bare CR or LF, a NUL, or a control byte in the target: the forms request
  smuggling and header injection use); both close. An absolute-form target
  (``http://host/path``) is served as its path.
* A connection silent for ``idle_timeout_s`` between requests is closed; a request
  head still incomplete ``idle_timeout_s`` after its first byte is answered 408 (a
  client trickling a head byte by byte cannot hold a connection). One sweep every few
  seconds checks every connection; there is no timer per request. A request in
  progress (a long ``/wait``) is never timed out here.
* A client that goes away while its request is forwarded cancels ``dispatch``'s
  Deferred, which cancels the upstream request.
* Beyond ``max_connections`` open connections a new one is closed at once.
* :meth:`GatewayServerFactory.drain` (SIGTERM) lets requests in progress finish:
  idle connections close at once, busy ones after their answer.
* ``dispatch`` returns the body bytes, or a Deferred firing with them; an unexpected
  exception or failure is logged and answered 500 with an empty body.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from typing import Any
from typing import Protocol as TypingProtocol

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES

from mortred_twisted.gateway.transport import eager_write
from mortred_twisted.http.limits import http_date

log = Logger()

#: Largest request head (request line + headers).
MAX_HEAD = 64 * 1024
#: Most header lines in one request.
MAX_HEADERS = 200
#: Bytes buffered behind the request in progress before reading pauses.
MAX_PIPELINED = 256 * 1024
#: Default idle timeout (twisted.web's default too).
IDLE_TIMEOUT_S = 60.0

_REASONS = {**RESPONSES, 422: b"Unprocessable Entity", 431: b"Request Header Fields Too Large"}
#: The token characters (RFC 9110); ``x.translate(None, _TOKEN)`` is empty for a token.
_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_SERVER = b"mortred-gateway"
#: Bytes never allowed in a request target (controls, space, DEL).
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
_JSON = b"application/json; charset=utf-8"


class App(TypingProtocol):
    """What the server serves: :class:`~mortred_twisted.http.gateway.GatewayApp`."""

    def dispatch(self, request: Any) -> bytes | defer.Deferred[bytes]: ...


class HeaderMap:
    """Headers by lower-cased name, in arrival order, with the ``Headers`` methods
    the gateway calls (``getRawHeaders``, ``setRawHeaders``, ``addRawHeader``)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        #: lower-cased name -> (name as given, values)
        self._items: dict[bytes, tuple[bytes, list[bytes]]] = {}

    def getRawHeaders(self, name: bytes, default: Any = None) -> list[bytes] | Any:
        item = self._items.get(name.lower())
        return item[1] if item is not None else default

    def setRawHeaders(self, name: bytes, values: list[bytes]) -> None:
        self._items[name.lower()] = (name, list(values))

    def addRawHeader(self, name: bytes, value: bytes) -> None:
        item = self._items.get(name.lower())
        if item is None:
            self._items[name.lower()] = (name, [value])
        else:
            item[1].append(value)


class ProxyRequest:
    """One request as ``GatewayApp.dispatch`` sees it (a subset of ``IRequest``).

    ``content`` is a ``BytesIO`` over the body (it shares the bytes, no copy) or None.
    The response side is filled by the app: ``code``, ``responseHeaders``.
    """

    __slots__ = (
        "clientproto",
        "code",
        "content",
        "keep_alive",
        "method",
        "path",
        "requestHeaders",
        "responseHeaders",
        "uri",
    )

    def __init__(
        self, method: bytes, uri: bytes, clientproto: bytes, headers: HeaderMap, keep_alive: bool
    ) -> None:
        self.method = method
        self.uri = uri
        self.path = uri.partition(b"?")[0]
        self.clientproto = clientproto
        self.requestHeaders = headers
        self.responseHeaders = HeaderMap()
        self.code = 200
        self.content: io.BytesIO | None = None
        self.keep_alive = keep_alive

    def getHeader(self, name: bytes) -> bytes | None:
        item = self.requestHeaders._items.get(name.lower())
        return item[1][-1] if item is not None else None

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders._items[name.lower()] = (name, [value])

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code


class BadRequest(Exception):
    """A request the server refuses itself (status, message), then closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def encode_response(request: ProxyRequest, body: bytes, close: bool) -> bytes:
    """Status line, headers and body of ``request``'s answer, as one buffer.

    ``Content-Length`` is the app's if it set one (a HEAD answer keeps the GET's),
    else ``len(body)``; ``Date``, ``Server`` and ``Connection`` are the server's."""
    code = request.code
    parts = [b"HTTP/1.1 %d %s\r\n" % (code, _REASONS.get(code, b"Unknown"))]
    items = request.responseHeaders._items
    for low, (name, values) in items.items():
        if low == b"connection" or low == b"date" or low == b"server":
            continue
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    if b"content-length" not in items:
        parts.append(b"Content-Length: %d\r\n" % len(body))
    parts += (b"Date: ", http_date(), b"\r\nServer: ", _SERVER, b"\r\n")
    if close:
        parts.append(b"Connection: close\r\n")
    elif request.clientproto == b"HTTP/1.0":
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"\r\n")
    if request.method != b"HEAD":
        parts.append(body)
    return b"".join(parts)


def error_response(status: int, message: str) -> bytes:
    """A server-made JSON error that closes the connection."""
    body = json.dumps({"error": message}).encode("utf-8")
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error")),
            b"Content-Type: ", _JSON, b"\r\nCache-Control: no-store\r\n",
            b"Content-Length: %d\r\nDate: " % len(body), http_date(),
            b"\r\nServer: ", _SERVER, b"\r\nConnection: close\r\n\r\n", body,
        )
    )  # fmt: skip


def origin_form(target: bytes) -> bytes:
    """The path (and query) of an absolute-form request target (``http://h:p/x?q``);
    raises :class:`BadRequest` for anything else that is not origin-form."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise BadRequest(400, "malformed request target")
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=-1)
    if cut < 0:
        return b"/"
    return rest[cut:] if rest[cut : cut + 1] == b"/" else b"/" + rest[cut:]


def parse_head(head: bytes) -> tuple[ProxyRequest, int, bool, bool]:
    """(request, body length, chunked, expects 100-continue) of a request head
    (without its final blank line); raises :class:`BadRequest`."""
    lines = head.split(b"\r\n")
    breaks = len(lines) - 1
    if head.count(b"\n") != breaks or head.count(b"\r") != breaks or b"\0" in head:
        # A bare CR or LF is where request smuggling and header injection start.
        raise BadRequest(400, "bare CR, LF or NUL in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, uri, proto = parts
    if proto != b"HTTP/1.1" and proto != b"HTTP/1.0":
        raise BadRequest(400, "unsupported HTTP version")
    if method.translate(None, _TOKEN) or _BAD_TARGET.search(uri) is not None:
        raise BadRequest(400, "malformed request line")
    if uri[:1] != b"/" and uri != b"*":
        uri = origin_form(uri)
    if len(lines) > MAX_HEADERS + 1:
        raise BadRequest(431, "too many header lines")
    headers = HeaderMap()
    items = headers._items
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name.translate(None, _TOKEN):
            raise BadRequest(400, "malformed header line")
        low = name.lower()
        item = items.get(low)
        if item is None:
            items[low] = (name, [value.strip(b" \t")])
        else:
            item[1].append(value.strip(b" \t"))
    length = 0
    chunked = False
    te = items.get(b"transfer-encoding")
    cl = items.get(b"content-length")
    if te is not None:
        if cl is not None:
            raise BadRequest(400, "both Content-Length and Transfer-Encoding")
        if [v.lower() for v in te[1]] != [b"chunked"]:
            raise BadRequest(400, "unsupported Transfer-Encoding")
        chunked = True
    elif cl is not None:
        values = {v.strip() for raw in cl[1] for v in raw.split(b",")}
        if len(values) != 1:
            raise BadRequest(400, "conflicting Content-Length")
        value = values.pop().strip()
        if not value.isdigit():
            raise BadRequest(400, "invalid Content-Length")
        length = int(value)
    conn = items.get(b"connection")
    tokens = {t.strip().lower() for v in conn[1] for t in v.split(b",")} if conn else set()
    # HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 only when asked.
    keep_alive = b"close" not in tokens if proto == b"HTTP/1.1" else b"keep-alive" in tokens
    expect = items.get(b"expect")
    continue_ = (
        expect is not None
        and proto == b"HTTP/1.1"
        and expect[1][-1].lower() == b"100-continue"
        and (chunked or length > 0)
    )
    return ProxyRequest(method, uri, proto, headers, keep_alive), length, chunked, continue_


class ChunkedBody:
    """Incremental ``Transfer-Encoding: chunked`` decoder with a size limit."""

    __slots__ = ("_buf", "_chunks", "_limit", "_size", "done")

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = limit
        self.done = False

    @property
    def size(self) -> int:
        return self._size

    def feed(self, data: bytes) -> bytes:
        """Consume ``data``; returns the bytes after the body once :attr:`done`.
        Raises :class:`BadRequest` (400, or 413 past the limit)."""
        buf = self._buf
        buf += data
        while True:
            eol = buf.find(b"\r\n")
            if eol < 0:
                if len(buf) > 4096:
                    raise BadRequest(400, "malformed chunk size line")
                return b""
            try:
                size = int(bytes(buf[:eol]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest(400, "malformed chunk size line") from None
            if size < 0:
                raise BadRequest(400, "malformed chunk size line")
            if size == 0:
                # Optional trailers (dropped), then an empty line.
                pos = eol + 2
                if len(buf) < pos + 2:
                    return b""
                if buf[pos : pos + 2] == b"\r\n":
                    end = pos + 2
                else:
                    found = buf.find(b"\r\n\r\n", pos)
                    if found < 0:
                        if len(buf) - pos > MAX_HEAD:
                            raise BadRequest(431, "chunked trailers too large")
                        return b""
                    end = found + 4
                self.done = True
                rest = bytes(buf[end:])
                buf.clear()
                return rest
            if self._size + size > self._limit:
                self._size += size
                raise BadRequest(413, "too large")
            start = eol + 2
            if len(buf) < start + size + 2:
                return b""
            if buf[start + size : start + size + 2] != b"\r\n":
                raise BadRequest(400, "malformed chunk")
            self._chunks.append(bytes(buf[start : start + size]))
            self._size += size
            del buf[: start + size + 2]

    def body(self) -> bytes:
        return b"".join(self._chunks)


_HEAD, _BODY, _CHUNKED, _BUSY, _CLOSED = range(5)


class GatewayConnection(Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, factory: GatewayServerFactory) -> None:
        self.factory = factory
        self._state = _HEAD
        self._buf = b""
        self._request: ProxyRequest | None = None
        self._need = 0  # _BODY: bytes of body still to read
        self._parts: list[bytes] = []
        self._chunked: ChunkedBody | None = None
        self._pending: defer.Deferred[bytes] | None = None
        self._advancing = False
        self._paused = False
        self.last_active = 0.0
        #: when the first bytes of a still incomplete head arrived (None: no such head)
        self.head_since: float | None = None
        self._draining = False

    def connectionMade(self) -> None:
        self.last_active = self.factory.clock.seconds()
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)  # answers are single writes: never wait for an ACK

    # -- reading ---------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self._state
        if state == _CLOSED:
            return
        self.last_active = self.factory.clock.seconds()
        if state == _BUSY:
            self._buf += data
            if len(self._buf) > MAX_PIPELINED and not self._paused:
                self._paused = True
                self.transport.pauseProducing()
            return
        self._buf = self._buf + data if self._buf else data
        self._advance()

    def _advance(self) -> None:
        """Parse and dispatch while buffered bytes allow and no request is in progress."""
        if self._advancing:
            return
        self._advancing = True
        try:
            while self._step():
                pass
        finally:
            self._advancing = False

    def _step(self) -> bool:
        """One parsing step; False when more bytes (or the answer) are needed."""
        state = self._state
        buf = self._buf
        if state == _HEAD:
            if not buf:
                return False
            if buf.startswith(b"\r\n"):  # stray CRLFs between requests are allowed
                self._buf = buf.lstrip(b"\r\n")
                return bool(self._buf)
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._refuse(431, "request head too large")
                elif self.head_since is None:
                    self.head_since = self.factory.clock.seconds()
                return False
            self.head_since = None
            if end > MAX_HEAD:
                self._refuse(431, "request head too large")
                return False
            self._buf = buf[end + 4 :]
            try:
                request, length, chunked, continue_ = parse_head(buf[:end])
            except BadRequest as exc:
                self._refuse(exc.status, exc.message)
                return False
            limit = self.factory.max_body_bytes
            if length > limit:
                self._refuse(413, self.factory.too_large_message)
                return False
            self._request = request
            if continue_:
                eager_write(self.transport, b"HTTP/1.1 100 Continue\r\n\r\n")
            if chunked:
                self._chunked = ChunkedBody(limit)
                self._state = _CHUNKED
            elif length:
                self._need = length
                self._parts = []
                self._state = _BODY
            else:
                self._dispatch(request, b"")
            return True
        if state == _BODY:
            if not buf:
                return False
            need = self._need
            if len(buf) < need:
                self._parts.append(buf)
                self._need = need - len(buf)
                self._buf = b""
                return False
            self._parts.append(buf[:need])
            self._buf = buf[need:]
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self._parts = []
            assert self._request is not None
            self._dispatch(self._request, body)
            return True
        if state == _CHUNKED:
            if not buf:
                return False
            decoder = self._chunked
            assert decoder is not None
            self._buf = b""
            try:
                rest = decoder.feed(buf)
            except BadRequest as exc:
                message = self.factory.too_large_message if exc.status == 413 else exc.message
                self._refuse(exc.status, message)
                return False
            if not decoder.done:
                return False
            self._buf = rest
            self._chunked = None
            assert self._request is not None
            self._dispatch(self._request, decoder.body())
            return True
        return False  # _BUSY or _CLOSED

    def _peer(self) -> str:
        try:
            return str(self.transport.getPeer().host)
        except Exception:  # pragma: no cover - transports without a peer
            return ""

    # -- dispatching and answering ---------------------------------------------------

    def _dispatch(self, request: ProxyRequest, body: bytes) -> None:
        self._state = _BUSY
        if body:
            request.content = io.BytesIO(body)
        try:
            outcome = self.factory.app.dispatch(request)
        except Exception:
            log.failure("unhandled error in {path}", path=request.path)
            self._internal_error(request)
            return
        if isinstance(outcome, defer.Deferred):
            self._pending = outcome
            outcome.addCallbacks(
                self._answer, self._failed, callbackArgs=(request,), errbackArgs=(request,)
            )
        else:
            self._answer(outcome, request)

    def _answer(self, body: bytes, request: ProxyRequest) -> None:
        self._pending = None
        if self._state == _CLOSED:
            return
        close = not request.keep_alive or self._draining
        eager_write(self.transport, encode_response(request, body, close))
        if self.factory.access_log:
            self.factory.log_access(self._peer(), request, len(body))
        self._request = None
        if close:
            self._close()
            return
        self._state = _HEAD
        self.last_active = self.factory.clock.seconds()
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()
        if self._buf:
            self._advance()

    def _failed(self, failure: Failure, request: ProxyRequest) -> None:
        self._pending = None
        if failure.check(defer.CancelledError) or self._state == _CLOSED:
            return
        log.failure("unhandled error in {path}", failure, path=request.path)
        self._internal_error(request)

    def _internal_error(self, request: ProxyRequest) -> None:
        request.code = 500
        request.responseHeaders = HeaderMap()
        request.keep_alive = False
        self._answer(b"", request)

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request the server itself refuses, and close."""
        eager_write(self.transport, error_response(status, message))
        self.factory.refused(status)
        self._close()

    def _close(self) -> None:
        self._state = _CLOSED
        self._buf = b""
        self._parts = []
        self._chunked = None
        self.transport.loseConnection()

    def drain(self) -> None:
        """Stop keeping this connection alive (shutdown): closed now when it waits
        for a request, else after the answer to the request in progress or being
        read (with ``Connection: close``)."""
        if self._state == _CLOSED:
            return
        if self._state == _HEAD and not self._buf:
            self._close()
            return
        self._draining = True

    def expire(self, before: float) -> None:
        """The factory's sweep: a head begun before ``before`` and still incomplete is
        answered 408; a connection silent since before ``before`` between requests is
        closed. A request in progress is left alone."""
        state = self._state
        if state in (_BUSY, _CLOSED):
            return
        if state == _HEAD and self.head_since is not None and self.head_since < before:
            self._refuse(408, "request head not received in time")
        elif self.last_active < before:
            self._close()

    def connectionLost(self, reason: Failure | None = None) -> None:  # type: ignore[override]
        self._state = _CLOSED
        self.factory.forget(self)
        pending, self._pending = self._pending, None
        if pending is not None and not pending.called:
            pending.cancel()


class GatewayServerFactory(Factory):
    """Builds :class:`GatewayConnection` s for ``app``; owns the connection cap and
    the idle sweep. ``clock`` is the reactor (``task.Clock`` in tests)."""

    noisy = False

    def __init__(
        self,
        app: App,
        *,
        clock: IReactorTime,
        max_body_bytes: int,
        max_connections: int = 0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        access_log: bool = False,
        on_refused: Callable[[int], None] | None = None,
    ) -> None:
        self.app = app
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.access_log = access_log
        self.too_large_message = f"request entity too large (limit {max_body_bytes} bytes)"
        self._on_refused = on_refused
        self.connections: set[GatewayConnection] = set()
        self._sweeper: LoopingCall | None = None
        self.draining = False
        self._empty_waiters: list[defer.Deferred[None]] = []

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    def buildProtocol(self, addr: Any) -> GatewayConnection | None:
        if self.draining:
            return None
        if self.max_connections and len(self.connections) >= self.max_connections:
            return None
        conn = GatewayConnection(self)
        self.connections.add(conn)
        return conn

    def forget(self, conn: GatewayConnection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._empty_waiters:
            waiters, self._empty_waiters = self._empty_waiters, []
            for d in waiters:
                if not d.called:  # a waiter may have given up (timeout, cancel)
                    d.callback(None)

    def drain(self) -> defer.Deferred[None]:
        """Graceful shutdown, after the port stopped listening: refuse new
        connections, close idle ones now and the others after their current answer.
        Fires once every connection is gone (the caller bounds the wait)."""
        self.draining = True
        for conn in list(self.connections):
            conn.drain()
        if not self.connections:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._empty_waiters.append(d)
        return d

    def refused(self, status: int) -> None:
        if self._on_refused is not None:
            self._on_refused(status)

    def log_access(self, client: str, request: ProxyRequest, length: int) -> None:
        """One access-log line (``access_log=True`` only: it costs throughput)."""
        log.info(
            '{client} "{method} {uri} {proto}" {code} {length}',
            client=client,
            method=request.method.decode("latin-1"),
            uri=request.uri.decode("latin-1"),
            proto=request.clientproto.decode("latin-1"),
            code=request.code,
            length=length,
        )

    def sweep(self) -> None:
        """Expire connections idle, or slow to send a head, for ``idle_timeout_s``."""
        before = self.clock.seconds() - self.idle_timeout_s
        for conn in list(self.connections):
            conn.expire(before)

    def startFactory(self) -> None:
        if self.idle_timeout_s > 0 and self._sweeper is None:
            self._sweeper = LoopingCall(self.sweep)
            self._sweeper.clock = self.clock
            self._sweeper.start(min(5.0, self.idle_timeout_s / 2), now=False)

    def stopFactory(self) -> None:
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None
