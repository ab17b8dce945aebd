"""An in-memory HTTP client for the project's one HTTP server (treq's ``StubTreq``
shape): each request opens a connection from a fresh ``StringTransport`` to the
factory; its Deferred fires with a response once the answer's head was written (as
an ``Agent``'s does), and the body follows.

``client.request(method, url, headers=, data=)`` (and ``get``/``post``/``delete``)
returns a Deferred of a :class:`MemoryResponse` (``code``, ``headers`` as twisted
``Headers``, ``content()`` firing with the whole body, ``deliverBody(protocol)``
for a streamed one); :meth:`MemoryClient.flush` moves what the server wrote since
(call it after stepping the clock or the model threads, as with StubTreq).
Cancelling a request's Deferred before its head, or ``stopProducing()`` on a
delivered body's transport, closes the connection, as a client that goes away.
"""

from __future__ import annotations

import json as _json
from typing import Any
from urllib.parse import urlsplit

import httptools
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from mortred_twisted.http11.server import HTTPServerFactory


class _BodyTransport:
    """What a delivered body's protocol sees as its transport."""

    def __init__(self, exchange: _Exchange) -> None:
        self._exchange = exchange

    def stopProducing(self) -> None:
        self._exchange.leave()


class MemoryResponse:
    """One answer: its head now, its body as the server writes it."""

    def __init__(self, exchange: _Exchange, code: int, headers: Headers) -> None:
        self._exchange = exchange
        self.code = code
        self.headers = headers

    def content(self) -> defer.Deferred[bytes]:
        return self._exchange.whole_body()

    def deliverBody(self, protocol: Any) -> None:
        self._exchange.deliver(protocol)


class _Exchange:
    """One request on its own connection, parsed incrementally with llhttp."""

    def __init__(self, proto: Any, transport: StringTransport, head_only: bool) -> None:
        self.proto = proto
        self.transport = transport
        self.head_only = head_only
        self.parser = httptools.HttpResponseParser(self)
        self.response: defer.Deferred[MemoryResponse] = defer.Deferred(lambda _d: self.leave())
        self.headers = Headers()
        self.parts: list[bytes] = []
        self.complete = False
        self.gone = False
        self.protocol: Any = None
        self.waiters: list[defer.Deferred[bytes]] = []

    # llhttp callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.addRawHeader(name, value)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.headers = Headers()
            return
        if not self.response.called:
            self.response.callback(MemoryResponse(self, status, self.headers))
        if self.head_only:
            self._end()

    def on_body(self, data: bytes) -> None:
        if self.protocol is not None:
            self.protocol.dataReceived(data)
        else:
            self.parts.append(data)

    def on_message_complete(self) -> None:
        self._end()

    # the client side
    def pump(self) -> None:
        data = self.transport.value()
        self.transport.clear()
        if data and not self.complete:
            self.parser.feed_data(data)

    def _end(self) -> None:
        if self.complete:
            return
        self.complete = True
        body = b"".join(self.parts)
        if self.protocol is not None:
            self.protocol.connectionLost(Failure(ConnectionDone()))
        for d in self.waiters:
            d.callback(body)
        self.waiters = []

    def whole_body(self) -> defer.Deferred[bytes]:
        if self.complete:
            return defer.succeed(b"".join(self.parts))
        d: defer.Deferred[bytes] = defer.Deferred()
        self.waiters.append(d)
        return d

    def deliver(self, protocol: Any) -> None:
        self.protocol = protocol
        protocol.makeConnection(_BodyTransport(self))
        if self.parts:
            protocol.dataReceived(b"".join(self.parts))
            self.parts = []
        if self.complete:
            protocol.connectionLost(Failure(ConnectionDone()))

    def leave(self) -> None:
        """The client goes away."""
        if not self.gone:
            self.gone = True
            self.proto.connectionLost(Failure(ConnectionDone("client went away")))


class MemoryClient:
    """See the module docstring. ``factory``: an :class:`HTTPServerFactory`."""

    def __init__(self, factory: HTTPServerFactory, host: str = "127.0.0.1") -> None:
        self._factory = factory
        self._host = host
        self._open: list[_Exchange] = []

    def request(
        self,
        method: str,
        url: str,
        headers: dict[Any, Any] | Headers | None = None,
        data: bytes | str | None = None,
        json: Any = None,
        **_kw: Any,
    ) -> defer.Deferred[MemoryResponse]:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: " + (parts.netloc or "x").encode()]
        items = (
            headers.getAllRawHeaders() if isinstance(headers, Headers) else (headers or {}).items()
        )
        for name, value in items:
            values = value if isinstance(value, list) else [value]
            key = name if isinstance(name, bytes) else name.encode("latin-1")
            for v in values:
                lines.append(key + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")))
        if json is not None:
            data = _json.dumps(json)
            lines.append(b"Content-Type: application/json")
        body = data.encode("utf-8") if isinstance(data, str) else data or b""
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(b"Content-Length: %d" % len(body))
        address = IPv4Address("TCP", self._host, 40000)
        proto = self._factory.buildProtocol(address)
        if proto is None:
            return defer.fail(ConnectionRefusedError())
        transport = StringTransport(peerAddress=address)
        proto.makeConnection(transport)
        exchange = _Exchange(proto, transport, method == "HEAD")
        self._open.append(exchange)
        proto.dataReceived(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self.flush()
        return exchange.response

    def get(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("POST", url, **kw)

    def delete(self, url: str, **kw: Any) -> defer.Deferred[MemoryResponse]:
        return self.request("DELETE", url, **kw)

    def flush(self) -> None:
        """Deliver what the server wrote since the last flush."""
        for exchange in list(self._open):
            exchange.pump()
            if exchange.complete or exchange.gone:
                self._open.remove(exchange)
