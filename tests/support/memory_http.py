"""An in-memory HTTP client for the project's one HTTP server (treq's ``StubTreq``
shape): each request opens a connection from a fresh ``StringTransport`` to the
factory, and its Deferred fires with a response once the whole answer was written.

``client.request(method, url, headers=, data=)`` (and ``get``/``post``/``delete``)
returns a Deferred of a :class:`MemoryResponse` (``code``, ``headers`` as twisted
``Headers``, ``content()``); :meth:`MemoryClient.flush` delivers answers completed
since (call it after stepping the clock or the model threads, as with StubTreq);
cancelling a request's Deferred closes its connection, as a client that goes away.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httptools
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from mortred_twisted.http11.server import HTTPServerFactory


class MemoryResponse:
    """One complete answer."""

    def __init__(self, code: int, headers: Headers, body: bytes) -> None:
        self.code = code
        self.headers = headers
        self.body = body

    def content(self) -> defer.Deferred[bytes]:
        return defer.succeed(self.body)


class _Answer:
    """llhttp callbacks collecting one response."""

    def __init__(self) -> None:
        self.headers = Headers()
        self.parts: list[bytes] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.addRawHeader(name, value)

    def on_body(self, data: bytes) -> None:
        self.parts.append(data)

    def on_message_complete(self) -> None:
        self.complete = True


def parse_answer(raw: bytes, head: bool = False) -> MemoryResponse | None:
    """The first complete response in ``raw`` (1xx skipped), or None."""
    while raw:
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        if head:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                return None
            parser.feed_data(raw[: end + 4].replace(b"Transfer-Encoding: chunked\r\n", b""))
            if not raw.startswith(b"HTTP/1.1 1"):
                return MemoryResponse(parser.get_status_code(), answer.headers, b"")
            raw = raw[end + 4 :]
            continue
        try:
            parser.feed_data(raw)
        except httptools.HttpParserError:
            return None
        if not answer.complete:
            return None
        status = parser.get_status_code()
        if 100 <= status < 200:
            raw = raw.partition(b"\r\n\r\n")[2]
            continue
        return MemoryResponse(status, answer.headers, b"".join(answer.parts))
    return None


class MemoryClient:
    """See the module docstring. ``factory``: an :class:`HTTPServerFactory`."""

    def __init__(self, factory: HTTPServerFactory, host: str = "127.0.0.1") -> None:
        self._factory = factory
        self._host = host
        self._pending: list[tuple[StringTransport, defer.Deferred[MemoryResponse], bool]] = []

    def request(
        self,
        method: str,
        url: str,
        headers: dict[Any, Any] | None = None,
        data: bytes | None = None,
        **_kw: Any,
    ) -> defer.Deferred[MemoryResponse]:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: " + (parts.netloc or "x").encode()]
        for name, value in (headers or {}).items():
            values = value if isinstance(value, list) else [value]
            key = name if isinstance(name, bytes) else name.encode("latin-1")
            for v in values:
                lines.append(key + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")))
        body = data or b""
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: %d" % len(body))
        proto = self._factory.buildProtocol(IPv4Address("TCP", self._host, 40000))
        transport = StringTransport(peerAddress=IPv4Address("TCP", self._host, 40000))

        def gone(_d: Any) -> None:
            proto.connectionLost(Failure(ConnectionError("client went away")))

        d: defer.Deferred[MemoryResponse] = defer.Deferred(gone)
        if proto is None:
            d.errback(ConnectionRefusedError())
            return d
        proto.makeConnection(transport)
        self._pending.append((transport, d, method == "HEAD"))
        proto.dataReceived(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self.flush()
        return d

    def get(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("POST", url, **kw)

    def delete(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("DELETE", url, **kw)

    def flush(self) -> None:
        """Fire the Deferreds of requests whose answer is complete now."""
        for item in list(self._pending):
            transport, d, head = item
            if d.called:
                self._pending.remove(item)
                continue
            answer = parse_answer(transport.value(), head)
            if answer is not None:
                self._pending.remove(item)
                d.callback(answer)
