"""The gateway's messages: requests as ``GatewayApp.dispatch`` sees them, answers as
single buffers, and the RFC 9112/9110 rules llhttp leaves to the application (pure:
no reactor, no sockets; :mod:`~mortred_twisted.http11.server` drives them)."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from twisted.web.http import RESPONSES, datetimeToString

_REASONS = {
    **RESPONSES,
    417: b"Expectation Failed",
    421: b"Misdirected Request",
    422: b"Unprocessable Entity",
    431: b"Request Header Fields Too Large",
}
_SERVER = b"mortred"
_JSON = b"application/json; charset=utf-8"
_date_cache: list[Any] = [0, b""]
#: On every answer: a browser never sniffs a type the answer does not declare.
NOSNIFF = b"X-Content-Type-Options: nosniff\r\n"


def http_date() -> bytes:
    """The ``Date`` header value, formatted once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = datetimeToString(now)
    return bytes(_date_cache[1])


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


class ServerRequest:
    """One request as ``GatewayApp.dispatch`` sees it (a subset of ``IRequest``).

    ``content`` is a ``BytesIO`` over the body (it shares the bytes, no copy) or None.
    The response side is filled by the app: ``code``, ``responseHeaders``, and for a
    streamed answer :meth:`write` (``IRequest.write``): the first call sends the head
    (chunked on HTTP/1.1; on HTTP/1.0 the connection then closes at the end), each
    call one piece at once; the dispatch Deferred's bytes are the last piece.
    After :meth:`declare_length` the streamed answer is framed by that
    ``Content-Length`` instead (a result file: keep-alive kept, ranges possible);
    the connection counts what is written in ``sent`` and closes it if the answer
    ends short (the client then sees it cut, never a short complete answer).
    """

    __slots__ = (
        "channel",
        "clientproto",
        "code",
        "content",
        "decided",
        "held",
        "keep_alive",
        "length",
        "method",
        "path",
        "peer",
        "producer",
        "requestHeaders",
        "responseHeaders",
        "sent",
        "started",
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
        self.peer: Any = None  # the client's address (IAddress), set by the connection
        self.channel: Any = None  # the connection, for streamed answers (write)
        self.started = False  # a streamed answer's head was sent
        self.held = 0  # body bytes held against the server's budget
        self.producer: Any = None  # a streamed answer's source (IPushProducer)
        self.decided: Any = None  # what the app decided from the head, for dispatch
        self.length: int | None = None  # a streamed answer's declared Content-Length
        self.sent = 0  # body bytes of a length-framed streamed answer written so far

    def declare_length(self, length: int | None) -> None:
        """Frame the streamed answer about to be written by ``Content-Length:
        length`` (not chunked); call before the first :meth:`write`. None takes a
        declaration back (its source failed before the head: another answer)."""
        self.length = length
        if length is None:
            self.responseHeaders._items.pop(b"content-length", None)
        else:
            self.responseHeaders._items[b"content-length"] = (b"Content-Length", [b"%d" % length])

    def write(self, data: bytes) -> None:
        """Send ``data`` now, as the next piece of a streamed answer."""
        self.channel.write_body(self, data)

    def registerProducer(self, producer: Any, streaming: bool = True) -> None:
        """A streamed answer's source: paused while the client does not read (the
        connection's write flow control), resumed once it did. Push producers only."""
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def getClientAddress(self) -> Any:
        return self.peer

    def getHeader(self, name: bytes) -> bytes | None:
        item = self.requestHeaders._items.get(name.lower())
        return item[1][-1] if item is not None else None

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders._items[name.lower()] = (name, [value])

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code


class Refusal(Exception):
    """A request the server refuses itself (status, message), then closes.
    ``response``: the whole answer, when the app decided it (else the server's
    :meth:`~mortred_twisted.http11.server.HTTPServerFactory.refusal_response`)."""

    def __init__(self, status: int, message: str, response: bytes | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.response = response


class StreamCut(Exception):
    """A streamed answer that cannot be completed (its source broke off): the server
    closes the connection without the final chunk, so the client sees it cut."""


def encode_response(
    request: ServerRequest, body: bytes, close: bool, server: bytes = _SERVER
) -> bytes:
    """Status line, headers and body of ``request``'s answer, as one buffer.

    ``Content-Length`` is the app's if it set one (a HEAD answer keeps the GET's),
    else ``len(body)`` (none on a 304 or 204); ``Date``, ``Server`` and
    ``Connection`` are the server's, and ``X-Content-Type-Options: nosniff`` unless
    the app set it."""
    code = request.code
    parts = [b"HTTP/1.1 %d %s\r\n" % (code, _REASONS.get(code, b"Unknown"))]
    items = request.responseHeaders._items
    for low, (name, values) in items.items():
        if low == b"connection" or low == b"date" or low == b"server":
            continue
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    if b"content-length" not in items and code != 304 and code != 204:
        # (RFC 9110 8.6: a 304's may only be the 200's length, a 204 has none)
        parts.append(b"Content-Length: %d\r\n" % len(body))
    if b"x-content-type-options" not in items:
        parts.append(NOSNIFF)
    parts += (b"Date: ", http_date(), b"\r\nServer: ", server, b"\r\n")
    if close:
        parts.append(b"Connection: close\r\n")
    elif request.clientproto == b"HTTP/1.0":
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"\r\n")
    if request.method != b"HEAD":
        parts.append(body)
    return b"".join(parts)


_SERVER_OWNED = frozenset((b"connection", b"date", b"server"))
#: framing headers a streamed answer sets itself
_STREAM_OWNED = _SERVER_OWNED | {b"content-length", b"transfer-encoding"}


def _head(request: ServerRequest, skip: frozenset[bytes]) -> list[bytes]:
    code = request.code
    parts = [b"HTTP/1.1 %d %s\r\n" % (code, _REASONS.get(code, b"Unknown"))]
    for low, (name, values) in request.responseHeaders._items.items():
        if low in skip:
            continue
        for value in values:
            parts += (name, b": ", value, b"\r\n")
    return parts


def encode_stream_head(request: ServerRequest, chunked: bool, server: bytes = _SERVER) -> bytes:
    """The head of a streamed answer: ``Transfer-Encoding: chunked`` (HTTP/1.1), or
    no framing and ``Connection: close`` (HTTP/1.0: the close ends the body)."""
    parts = _head(request, _STREAM_OWNED)
    if b"x-content-type-options" not in request.responseHeaders._items:
        parts.append(NOSNIFF)
    parts += (b"Date: ", http_date(), b"\r\nServer: ", server, b"\r\n")
    parts.append(b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Connection: close\r\n\r\n")
    return b"".join(parts)


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: that would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def error_response(
    status: int, message: str, server: bytes = _SERVER, retry_after: int | None = None
) -> bytes:
    """A server-made JSON error that closes the connection."""
    body = json.dumps({"error": message}).encode("utf-8")
    retry = b"" if retry_after is None else b"Retry-After: %d\r\n" % retry_after
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error")), retry,
            b"Content-Type: ", _JSON, b"\r\nCache-Control: no-store\r\n", NOSNIFF,
            b"Content-Length: %d\r\nDate: " % len(body), http_date(),
            b"\r\nServer: ", server, b"\r\nConnection: close\r\n\r\n", body,
        )
    )  # fmt: skip


def origin_form(target: bytes) -> bytes:
    """The path (and query) of a request target: itself in origin-form (``/x?q``) or
    ``*``, the path of an ``http(s)`` absolute form (``http://h:p/x?q``); raises
    :class:`Refusal` for anything else (authority form, other schemes)."""
    if target[:1] == b"/" or target == b"*":
        return target
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise Refusal(400, "malformed request target")
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=-1)
    if cut < 0:
        return b"/"
    return rest[cut:] if rest[cut : cut + 1] == b"/" else b"/" + rest[cut:]


def check_head(version: str, headers: HeaderMap) -> bool:
    """Apply the rules llhttp leaves to the application to an accepted head; returns
    whether the client expects ``100 Continue``. Raises :class:`Refusal`."""
    items = headers._items
    if version == "1.1":
        host = items.get(b"host")
        if host is None or len(host[1]) != 1:
            raise Refusal(400, "HTTP/1.1 request without exactly one Host header")
    elif version != "1.0":
        raise Refusal(400, "unsupported HTTP version")
    te = items.get(b"transfer-encoding")
    if te is not None:
        if version == "1.0":
            raise Refusal(400, "Transfer-Encoding in an HTTP/1.0 request")
        codings = [c.strip().lower() for v in te[1] for c in v.split(b",")]
        if codings[-1] != b"chunked":  # the length cannot be known (RFC 9112 6.3)
            raise Refusal(400, "Transfer-Encoding without a final chunked")
        if codings.count(b"chunked") != 1:  # never applied twice (RFC 9112 6.1)
            raise Refusal(400, "chunked applied more than once")
        if len(codings) != 1:
            raise Refusal(501, "unsupported Transfer-Encoding (only chunked)")
    expect = items.get(b"expect")
    if expect is None:
        return False
    if len(expect[1]) != 1 or expect[1][0].lower() != b"100-continue":
        raise Refusal(417, "unsupported Expect (only 100-continue)")
    return version == "1.1"
