"""One HTTP/1.1 connection of the project's server: llhttp framing, our request
handling, write flow control (edge). Its factory (connection caps, the body budget,
deadlines, drain) is :class:`~mortred_twisted.http11.server.HTTPServerFactory`.

Framing (request line, header syntax, ``Content-Length``, chunk sizes and
extensions, trailers, ``Transfer-Encoding`` placement) is decided by **llhttp**
through ``httptools`` (the parser of Node.js and uvicorn, fuzzed upstream), with
every lenient flag off (its default). This module adds what a parser leaves to the
application (RFC 9112/9110) and the gateway's connection handling; why not
twisted.web: ``docs/architecture.md`` (it costs about twice the CPU per proxied
request, and the gateway's CPU bounds its throughput). The gateway's decisions all
live in :meth:`~mortred_twisted.http.gateway.GatewayApp.dispatch`; this module hands
it a :class:`~.messages.ServerRequest` (the subset of ``IRequest`` it reads and
writes; the rules on a parsed head are :func:`~.messages.check_head`).

Contract (one :class:`HTTPConnection` per TCP connection, reactor thread only):

* HTTP/1.1 keep-alive (HTTP/1.0: only with ``Connection: keep-alive``), as llhttp's
  ``should_keep_alive`` says; ``Connection: close`` is honoured and echoed, and
  nothing after such a request is read. Pipelined requests are parsed ahead and
  answered in order, one at a time; reading pauses while more than
  :data:`MAX_PIPELINED` bytes arrived behind the request in progress.
* Refused, and the connection closed after the answers to the requests before it
  (nothing after a refusal is read as a request): anything llhttp rejects (400:
  a bare CR or LF, NUL or controls in the head, obs-fold, a malformed chunk size or
  extension, duplicate or malformed ``Content-Length``, ``Content-Length`` with
  ``Transfer-Encoding``, a ``Transfer-Encoding`` whose last coding is not
  ``chunked``, an unknown method or version); a version other than 1.0/1.1 (400);
  HTTP/1.1 without exactly one ``Host`` (400); ``Transfer-Encoding`` on HTTP/1.0
  (400); a transfer coding other than a lone ``chunked`` (501: we decode none);
  an ``Expect`` other than ``100-continue`` (417); a target that is not
  origin-form, ``*`` or an ``http(s)`` absolute form (400); a head over
  :data:`MAX_HEAD` bytes or :data:`MAX_HEADERS` fields (431). An ``Upgrade`` request
  is answered as a plain request, then the connection closes (``CONNECT``'s
  authority-form target is a 400).
* **Decided from the head.** A request that carries a body (``Content-Length`` >
  0 or chunked) is judged when its head is complete, before a body byte is read or
  ``100 Continue`` is sent: first the app's ``refuse_head`` (route, method,
  credentials, ``Content-Type``: 401/403/404/405/415, and its own 413), then
  ``max_body_bytes`` (413), then the process's **body budget** (503 +
  ``Retry-After``: the bytes of request bodies held at once, reserved as they
  arrive, never from a head alone, and released when the request is answered; a
  head whose declared length does not fit in what is free now is refused, and
  reserves nothing either way). A refusal is answered with ``Connection: close``
  and the rest is not read. A body that grows over a limit (the size limit, or
  the budget as its bytes arrive) is refused as soon as it does.
  ``Expect: 100-continue`` is otherwise answered ``100 Continue`` once the head is
  accepted and the request is next in line.
* **Per-address cap:** a client address with ``max_connections_per_address``
  connections open gets no more (the new one is closed at once, and counted).
* **Write flow control** (uvicorn's): once an answer does not fit in the socket,
  the connection registers itself as the transport's streaming producer; while
  Twisted's write buffer is over its high-water mark (``bufferSize``) the
  connection reads nothing, dispatches no pipelined request, and pauses a
  streamed answer's producer (``request.registerProducer``); all resume once the
  buffer drained. A streamed answer without a producer that keeps writing while
  paused is cut after :data:`MAX_PAUSED_WRITE` bytes (a client that does not read
  cannot make the process hold its stream). **Write deadline** (nginx's
  ``send_timeout``): a connection paused for its writes whose client has taken none
  of its bytes for ``write_timeout_s`` (the read deadline's value unless set) is
  aborted, whatever it has queued or streams: a client that pipelines requests and
  never reads cannot hold its connection slot, nor the body budget of its queued
  requests. Any byte taken restarts the deadline (a slow reader keeps its
  connection); on a transport that does not say what it still holds (TLS, tests'
  fakes), the deadline runs from the pause.
* An exception while an answer is produced or written is logged and closes that
  connection (it is never left busy). A ``HEAD`` answer carries no body, a
  streamed one no chunk (not even the last).
* Deadlines, checked by one sweep every few seconds (no timer per request): a head
  still incomplete ``read_timeout_s`` after its first byte, or a body still
  incomplete ``read_timeout_s`` after its head, is answered 408 (a client
  trickling bytes cannot hold a connection); a connection silent for
  ``idle_timeout_s`` between requests is closed. A connection the server closes
  is aborted :data:`ABORT_TIMEOUT_S` later if its last answer is still unread (a
  client that stops reading cannot hold it open). A request in progress (a long
  ``/wait``) is never timed out here; a request read behind it gets its deadline
  from the moment it is next in line.
* A client that goes away while its request is forwarded cancels ``dispatch``'s
  Deferred, which cancels the upstream request.
* Beyond ``max_connections`` open connections a new one is closed at once.
* :meth:`HTTPServerFactory.drain` (SIGTERM) lets requests in progress finish:
  idle connections close at once, busy ones after their answer; a streamed answer
  in progress is ended at once (final chunk, then close).
* ``dispatch`` returns the body bytes, or a Deferred firing with them; an unexpected
  exception or failure is logged and answered 500 with an empty body.
* A **streamed answer** (a job's event stream): the app calls ``request.write`` while
  its Deferred is pending. The first call sends the head (``Transfer-Encoding:
  chunked`` on HTTP/1.1; on HTTP/1.0 no framing, and the connection closes at the
  end), every call one piece at once (nothing is held back); the Deferred's bytes
  are the last piece, then the final chunk. If the Deferred fails after the head
  (:class:`~.messages.StreamCut`: the source broke off) the connection closes
  without the final chunk, so the client sees the answer cut. A client that goes
  away cancels the Deferred, as for any answer.
* A **length-framed streamed answer** (a result file): the app calls
  ``request.declare_length(n)`` before its first write; the head then carries
  ``Content-Length: n`` (keep-alive kept) and the pieces go out unframed. A piece
  past ``n`` aborts the connection; an answer that ends short closes it (the client
  sees it cut, never a short complete answer). Drain lets it finish, like a plain
  answer. Its source registers as the request's producer, so a client that does
  not read holds at most the transport's buffer and one piece in flight.
"""

from __future__ import annotations

import io
from collections import deque
from typing import TYPE_CHECKING, Any, NoReturn
from typing import Protocol as TypingProtocol

import httptools
from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.http11.messages import (
    LAST_CHUNK,
    HeaderMap,
    Refusal,
    ServerRequest,
    StreamCut,
    check_head,
    encode_chunk,
    encode_response,
    encode_stream_head,
    origin_form,
)
from mortred_twisted.http11.transport import EagerWriter

if TYPE_CHECKING:
    from mortred_twisted.http11.server import HTTPServerFactory

log = Logger()

#: Largest request head (request target + header fields): twisted.web's limit too,
#: so the gateway and the model ports refuse the same heads.
MAX_HEAD = 16 * 1024
#: Most header fields in one request.
MAX_HEADERS = 200
#: Bytes read behind the request in progress before reading pauses.
MAX_PIPELINED = 256 * 1024
#: Default idle timeout (twisted.web's default too).
IDLE_TIMEOUT_S = 60.0
#: Default deadline for a request head (from its first byte) and for its body (from
#: the end of the head).
READ_TIMEOUT_S = 60.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: Bytes a streamed answer without a producer may write while the client does not
#: read, before its connection is cut.
MAX_PAUSED_WRITE = 1024 * 1024
#: Seconds a closed connection may take to flush its last answer before it is aborted
#: (twisted.web's ``abortTimeout``): a client that stops reading cannot hold it open.
ABORT_TIMEOUT_S = 15.0


class App(TypingProtocol):
    """What the server serves: :class:`~mortred_twisted.http.gateway.GatewayApp`.

    An app may also define ``refuse_head(request, length) -> bytes | None``: called
    on the head of every request that carries a body (``length``: the declared
    ``Content-Length``, or -1 when chunked), before any of the body is read. It
    returns None to let the request in, or the body of a refusal whose status and
    headers it set on ``request`` (answered with ``Connection: close``)."""

    def dispatch(self, request: Any) -> bytes | defer.Deferred[bytes]: ...


class _Stop(Exception):
    """Raised in a parser callback to stop parsing (the reason is on the connection)."""


_REFUSED = object()  # queue marker: answer self._refusal, then close


class HTTPConnection(Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, factory: HTTPServerFactory) -> None:
        self.factory = factory
        self._parser = httptools.HttpRequestParser(self)
        self._writer: EagerWriter | None = None
        #: complete requests (request, body) not yet dispatched, or _REFUSED
        self._queue: deque[Any] = deque()
        self._busy = False  # a request was dispatched and is not answered yet
        self._stopped = False  # nothing more is parsed (refusal, close, upgrade)
        self._closed = False
        self._refusal: Refusal | None = None
        # the message being parsed
        self._in_message = False
        self._in_head = False
        self._url = b""
        self._headers = HeaderMap()
        self._head_size = 0
        self._fields = 0  # header (then trailer) fields of the message being parsed
        #: bytes read since the message began or last made progress (see dataReceived)
        self._reads = 0
        self._request: ServerRequest | None = None
        self._parts: list[bytes] = []
        self._body_size = 0
        self._continue = False  # the message being read awaits 100 Continue
        #: when the message being parsed started its current phase (head or body)
        self._since = 0.0
        self._pending: defer.Deferred[bytes] | None = None
        self._current: ServerRequest | None = None  # the request dispatched last
        self._advancing = False
        self._backlog = 0
        self._paused = False
        self._draining = False
        self._peer_address: Any = None
        self._abort_call: Any = None
        self.last_active = 0.0
        #: body bytes this connection holds against the factory's budget
        self._held = 0
        #: write flow control: registered as the transport's producer; paused
        self._producing = False
        self._write_paused = False
        self._paused_writes = 0  # stream bytes written while paused, no producer
        self._released_all = False
        self._address = ""
        #: write deadline: since when the paused connection's client took nothing,
        #: and how many bytes it had taken then (None: the transport does not say)
        self._write_since = 0.0
        self._taken_mark: int | None = None

    def connectionMade(self) -> None:
        self.last_active = self.factory.clock.seconds()
        self._writer = EagerWriter(self.transport, on_backlog=self._write_backlog)
        self._peer_address = self.transport.getPeer()  # one object per connection
        self._address = self._peer()
        self.factory.address_opened(self._address)
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)  # answers are single writes: never wait for an ACK

    # -- parser callbacks (llhttp, through httptools) ---------------------------------

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._url = b""
        self._headers = HeaderMap()
        self._head_size = self._reads = self._fields = 0
        self._since = self.factory.clock.seconds()

    def on_url(self, url: bytes) -> None:
        self._url += url  # llhttp may hand the target over in pieces
        self._head_size += len(url)
        if self._head_size > MAX_HEAD:
            self._stop(Refusal(431, "request head too large"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        self._fields += 1
        if self._head_size > MAX_HEAD or self._fields > MAX_HEADERS:
            self._stop(Refusal(431, "request head too large"))
        if not self._in_head:
            return  # a chunked body's trailer field: counted, never a header
        items = self._headers._items
        low = name.lower()
        item = items.get(low)
        if item is None:
            items[low] = (name, [value.strip(b" \t")])
        else:
            item[1].append(value.strip(b" \t"))

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._in_head = False
        self._reads = 0
        version = parser.get_http_version()
        headers = self._headers
        try:
            continue_ = check_head(version, headers)
            uri = origin_form(self._url)
        except Refusal as exc:
            self._stop(exc)
        proto = b"HTTP/1.1" if version == "1.1" else b"HTTP/1.0"
        request = ServerRequest(
            parser.get_method(), uri, proto, headers, parser.should_keep_alive()
        )
        request.peer = self._peer_address
        request.channel = self
        cl = headers._items.get(b"content-length")
        length = int(cl[1][0]) if cl is not None else 0  # one value of digits: llhttp's
        factory = self.factory
        if length or b"transfer-encoding" in headers._items:
            refusal = factory.judge_head(request, length if cl is not None else -1)
            if refusal is not None:
                self._stop(refusal)
            if length and not factory.body_fits(length):
                self._stop(factory.over_budget(request))
        self._request = request
        self._parts = []
        self._body_size = 0
        self._since = factory.clock.seconds()
        self._continue = continue_ and (length > 0 or b"transfer-encoding" in headers._items)
        if self._continue and not self._busy and not self._queue:
            self._send_continue()

    def on_chunk_header(self) -> None:
        self._reads = 0

    def on_chunk_complete(self) -> None:
        self._reads = 0

    def on_body(self, data: bytes) -> None:
        self._reads = 0
        self._body_size += len(data)
        request = self._request
        assert request is not None
        factory = self.factory
        if self._body_size > factory.max_body_bytes:
            self._stop(factory.too_large(request, self._body_size))
        # Reserved as the bytes arrive: a head alone holds none of the budget.
        if not factory.reserve_body(len(data)):
            self._stop(factory.over_budget(request))
        self._held += len(data)
        request.held += len(data)
        self._parts.append(data)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        parts = self._parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._queue.append((request, body))
        self._request = None
        self._parts = []
        self._in_message = self._continue = False
        if not request.keep_alive:
            self._stopped = True  # nothing after "Connection: close" is a request
            raise _Stop()

    def _stop(self, refusal: Refusal) -> NoReturn:
        """Queue ``refusal`` (answered after the requests before it) and stop parsing."""
        self._refusal = refusal
        self._queue.append(_REFUSED)
        self._stopped = True
        raise _Stop()

    # -- reading ---------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return  # after a refusal or a close, nothing is read as a request
        self.last_active = self.factory.clock.seconds()
        if self._in_message:
            # Bytes with no progress (a head, a chunk-size line or a trailer in
            # pieces): bounded below, as httptools keeps a partial field in memory.
            self._reads += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Upgrade or CONNECT: the request is answered as a plain one, and the
            # bytes after it are never read as HTTP.
            self._stopped = True
            if self._queue and self._queue[-1] is not _REFUSED:
                self._queue[-1][0].keep_alive = False
        except httptools.HttpParserCallbackError:
            if not self._stopped:  # pragma: no cover - a bug in a callback
                log.failure("parser callback failed")
                self._refusal = Refusal(400, "malformed request")
                self._queue.append(_REFUSED)
                self._stopped = True
        except httptools.HttpParserError as exc:
            self._refusal = Refusal(400, f"malformed request: {exc}")
            self._queue.append(_REFUSED)
            self._stopped = True
        if self._in_message and not self._stopped and self._reads > MAX_HEAD:
            what = "request head" if self._in_head else "chunk framing or trailer"
            self._refusal = Refusal(431, f"{what} too large")
            self._queue.append(_REFUSED)
            self._stopped = True
        if self._busy or self._write_paused:
            self._backlog += len(data)
            if self._backlog > MAX_PIPELINED and not self._paused:
                self._paused = True
                self.transport.pauseProducing()
            return
        self._next()

    def _send_continue(self) -> None:
        self._continue = False
        assert self._writer is not None
        self._writer.write(_CONTINUE)

    def _peer(self) -> str:
        return str(getattr(self._peer_address, "host", ""))

    # -- dispatching and answering ---------------------------------------------------

    def _next(self, answered: bool = False) -> None:
        """Dispatch the next queued request (or refusal) when none is in progress;
        ``answered``: called because the request in progress was just answered."""
        if self._advancing:
            return  # an answer given synchronously, inside the loop below
        self._advancing = True
        try:
            while not self._busy and self._queue and not self._closed and not self._write_paused:
                item = self._queue.popleft()
                if item is _REFUSED:
                    assert self._refusal is not None
                    self._refuse(self._refusal)
                    return
                self._dispatch(*item)
        finally:
            self._advancing = False
        if not self._busy and not self._closed and not self._write_paused:
            if self._paused:
                self._paused = False
                self.transport.resumeProducing()
            self._backlog = 0
            if answered and self._in_message:  # read behind an answer: deadline from now
                self._since = self.factory.clock.seconds()
                if self._continue and not self._stopped:
                    self._send_continue()

    def _dispatch(self, request: ServerRequest, body: bytes) -> None:
        self._busy = True
        self._current = request
        if body:
            request.content = io.BytesIO(body)
        try:
            outcome = self.factory.app.dispatch(request)
        except Exception:
            log.failure("unhandled error in {path}", path=request.path)
            self._internal_error(request)
            return
        if type(outcome) is not bytes and isinstance(outcome, defer.Deferred):  # ABC check last
            self._pending = outcome
            outcome.addCallbacks(
                self._answer, self._failed, callbackArgs=(request,), errbackArgs=(request,)
            )
        else:
            self._answer(outcome, request)

    def write_body(self, request: ServerRequest, data: bytes) -> None:
        """The next piece of ``request``'s streamed answer, sent now (the head first)."""
        if self._closed:
            return
        writer = self._writer
        assert writer is not None
        sized = request.length is not None
        chunked = not sized and request.clientproto == b"HTTP/1.1"
        if not request.started:
            request.started = True
            if sized:  # framed by the declared Content-Length: keep-alive stays
                close = not request.keep_alive or self._draining
                head = encode_response(request, b"", close, self.factory.server_header)
            else:
                if not chunked:
                    request.keep_alive = False  # the close ends the body
                head = encode_stream_head(request, chunked, self.factory.server_header)
            writer.write(head)
            if request.method == b"HEAD":  # the head is the whole answer: end it now
                self.factory.clock.callLater(0, self._end_head_stream, request)
                return
        if data and request.method != b"HEAD":
            if self._write_paused and request.producer is None:
                self._paused_writes += len(data)
                if self._paused_writes > MAX_PAUSED_WRITE:
                    log.warn("cut a stream its client does not read: {peer}", peer=self._peer())
                    self._close(abort=True)
                    return
            if sized:
                request.sent += len(data)
                if request.sent > request.length:  # type: ignore[operator]
                    log.error("a streamed answer overran its Content-Length: {path}",
                              path=request.path)  # fmt: skip
                    self._close(abort=True)
                    return
            writer.write(encode_chunk(data) if chunked else data)
        self.last_active = self.factory.clock.seconds()

    def _end_head_stream(self, request: ServerRequest) -> None:
        """A HEAD answer that would stream: its head was sent, nothing more will be;
        stop its producer (as if the client left) and go on with the connection."""
        if self._closed or self._current is not request or not self._busy:
            return
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.addErrback(lambda _f: None)
            pending.cancel()
        self._answer(b"", request)

    def _answer(self, body: bytes, request: ServerRequest) -> None:
        self._pending = None
        if request.held:
            self._release(request)
        if self._closed:
            return
        close = not request.keep_alive or self._draining
        assert self._writer is not None
        try:
            if request.started:  # the end of a streamed answer
                self.write_body(request, body)
                if request.length is not None:
                    if request.sent != request.length and request.method != b"HEAD":
                        close = True  # ended short: the client must see it cut
                elif request.clientproto == b"HTTP/1.1" and request.method != b"HEAD":
                    self._writer.write(LAST_CHUNK)
            else:
                self._writer.write(
                    encode_response(request, body, close, self.factory.server_header)
                )
        except Exception:
            log.failure("writing the answer to {path} failed", path=request.path)
            self._busy = False
            self._close(abort=True)
            return
        if self._closed:  # cut while writing (a stream its client did not read)
            return
        if self.factory.access_log:
            self.factory.log_access(self._peer(), request, len(body))
        self._busy = False
        if close:
            self._close()
            return
        self.last_active = self.factory.clock.seconds()
        self._next(answered=True)

    def _failed(self, failure: Failure, request: ServerRequest) -> None:
        self._pending = None
        self._release(request)
        if failure.check(defer.CancelledError) or self._closed:
            return
        if request.started:  # a streamed answer broke off: the client must see it cut
            if not failure.check(StreamCut):
                log.failure("unhandled error in {path}", failure, path=request.path)
            self._close()
            return
        log.failure("unhandled error in {path}", failure, path=request.path)
        self._internal_error(request)

    def _internal_error(self, request: ServerRequest) -> None:
        request.code = 500
        request.responseHeaders = HeaderMap()
        request.keep_alive = False
        self._answer(b"", request)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer a request the server itself refuses, and close."""
        assert self._writer is not None
        answer = refusal.response
        if answer is None:
            answer = self.factory.refusal_response(refusal.status, refusal.message, self._headers)
        self._writer.write(answer)
        self.factory.refused(refusal.status)
        self._close()

    def _close(self, abort: bool = False) -> None:
        self._closed = self._stopped = True
        self._busy = False
        self._queue.clear()
        self._parts = []
        if abort:
            self.transport.abortConnection()
            return
        if self._producing:  # else the transport waits for us before it closes
            self._producing = False
            self.transport.unregisterProducer()
        self.transport.loseConnection()
        if self._abort_call is None:
            self._abort_call = self.factory.clock.callLater(ABORT_TIMEOUT_S, self._abort)

    def _release(self, request: ServerRequest) -> None:
        """Give ``request``'s body bytes back to the factory's budget (once: a lost
        connection gave back all it held)."""
        if request.held:
            if not self._released_all:
                self.factory.release_body(request.held)
                self._held -= request.held
            request.held = 0

    # -- write flow control (IPushProducer of the transport) -------------------------

    def _write_backlog(self) -> None:
        """The socket did not take a whole write (Twisted holds the rest): from now
        on, let the transport tell us when its buffer is over/under its mark."""
        transport = self.transport
        if not self._producing and not self._closed and transport.producer is None:
            self._producing = True
            transport.registerProducer(self, True)

    def pauseProducing(self) -> None:
        """The transport's write buffer is over its high-water mark: stop reading,
        dispatching and streaming until it drained."""
        if self._write_paused or self._closed:
            return
        self._write_paused = True
        self._paused_writes = 0
        self._write_since = self.factory.clock.seconds()
        self._taken_mark = self._taken()
        self.factory.write_pauses += 1
        if not self._paused:
            self._paused = True
            self.transport.pauseProducing()
        request = self._current
        if self._busy and request is not None and request.producer is not None:
            request.producer.pauseProducing()

    def resumeProducing(self) -> None:
        """The write buffer drained: read, dispatch and stream again."""
        if not self._write_paused or self._closed:
            return
        self._write_paused = False
        request = self._current
        if self._busy and request is not None and request.producer is not None:
            request.producer.resumeProducing()
        if self._busy:
            if self._paused and self._backlog <= MAX_PIPELINED:
                self._paused = False
                self.transport.resumeProducing()
            return
        self._next()

    def stopProducing(self) -> None:
        """The transport is going away (connectionLost follows)."""

    def _abort(self) -> None:
        """The last answer was not read within ``ABORT_TIMEOUT_S`` of the close."""
        self._abort_call = None
        self.transport.abortConnection()

    def drain(self) -> None:
        """Stop keeping this connection alive (shutdown): closed now when it waits
        for a request, else after the answer to the request in progress or being
        read (with ``Connection: close``). A streamed answer in progress (an event
        stream, which may last as long as its job) is ended now, complete: the
        client reconnects elsewhere or later."""
        if self._closed:
            return
        if not self._busy and not self._queue and not self._in_message:
            self._close()
            return
        self._draining = True
        request = self._current
        if self._busy and request is not None and request.started and request.length is None:
            pending, self._pending = self._pending, None
            if request.clientproto == b"HTTP/1.1":
                assert self._writer is not None
                self._writer.write(LAST_CHUNK)
            self._close()
            if pending is not None:
                pending.cancel()  # releases the upstream stream

    def _taken(self) -> int | None:
        """Bytes of ours the socket has taken out of what Twisted held for us, or
        None when the transport does not say what it still holds. Reads the write
        buffer of Twisted's ``FileDescriptor`` (``dataBuffer`` from ``offset``,
        plus ``_tempDataLen``): its layout since Twisted 8."""
        transport = self.transport
        buffer = getattr(transport, "dataBuffer", None)
        writer = self._writer
        if buffer is None or writer is None:
            return None
        held = len(buffer) - getattr(transport, "offset", 0)
        return writer.queued - held - getattr(transport, "_tempDataLen", 0)

    def expire(
        self, now: float, idle_before: float, read_before: float, write_before: float
    ) -> None:
        """The factory's sweep at ``now``: a connection paused for its writes whose
        client took nothing since before ``write_before`` is aborted; a head or a
        body begun before ``read_before`` and still incomplete is answered 408; a
        connection silent since before ``idle_before`` between requests is closed.
        A request in progress, and what is read behind it, is left alone by the
        read and idle deadlines."""
        if self._closed:
            return
        if self._write_paused:
            taken = self._taken()
            if taken is not None and taken != self._taken_mark:
                self._taken_mark = taken  # the client read something: not stuck
                self._write_since = now
            elif self._write_since < write_before:
                log.info("aborted a connection whose client reads nothing: {peer}",
                         peer=self._peer())  # fmt: skip
                self.factory.write_timeouts += 1
                self._close(abort=True)
                return
        if self._busy or self._queue:
            return
        if self._in_message:
            if self._since < read_before:
                what = "head" if self._in_head else "body"
                self._stopped = True
                self._refuse(Refusal(408, f"request {what} not received in time"))
        elif self.last_active < idle_before:
            self._close()

    def connectionLost(self, reason: Failure | None = None) -> None:  # type: ignore[override]
        self._closed = self._stopped = True
        if self._abort_call is not None:
            if self._abort_call.active():
                self._abort_call.cancel()
            self._abort_call = None
        self._queue.clear()
        if self._held:
            self.factory.release_body(self._held)
            self._held = 0
        self._released_all = True
        self.factory.address_closed(self._address)
        self.factory.forget(self)
        self._drop_unsent()
        pending, self._pending = self._pending, None
        if pending is not None:
            # Also when it already fired and waits on another Deferred (a stream's
            # end): cancel() is forwarded to that one.
            pending.cancel()
        self._current = None

    def _drop_unsent(self) -> None:
        """Free now what Twisted still held for the client (it will never take it):
        a slow reader's last answer pieces would otherwise wait for the cyclic GC
        (connection, request and producer refer to each other). Twisted's
        ``FileDescriptor`` write buffer, as :meth:`_taken` reads it."""
        transport = self.transport
        if getattr(transport, "dataBuffer", None) is None:
            return
        transport.dataBuffer = b""
        transport.offset = 0
        if hasattr(transport, "_tempDataBuffer"):
            transport._tempDataBuffer = []
            transport._tempDataLen = 0
