"""The gateway's ``Site``: 413 right after the headers, and a connection cap (edge).

twisted.web reads a whole body before any route runs, so the size limit has to live
in the ``Request``: :class:`LimitedRequest` answers 413 as soon as a ``Content-Length``
over the limit is seen (no ``100 Continue`` is sent) or as soon as a chunked body grows
past it, and closes the connection; the route never runs and nothing is forwarded.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.web.server import Request, Site


def _raw_response(status: int, reason: bytes, message: str) -> bytes:
    body = json.dumps({"error": message}).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} ".encode("ascii")
        + reason
        + b"\r\nContent-Type: application/json; charset=utf-8\r\n"
        + b"Cache-Control: no-store\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode("ascii")
    )
    return head + body


class LimitedRequest(Request):
    """A ``Request`` that refuses bodies over ``site.max_body_bytes`` with 413."""

    _rejected = False
    _received = 0

    def _limit(self) -> int:
        return int(getattr(self.channel.site, "max_body_bytes", 0) or 0)  # type: ignore[union-attr]

    def _reject(self) -> None:
        self._rejected = True
        limit = self._limit()
        message = f"request entity too large (limit {limit} bytes)"
        self.requestHeaders.removeHeader(b"expect")  # no 100 Continue after a 413
        transport = self.channel.transport  # type: ignore[union-attr]
        transport.write(_raw_response(413, b"Request Entity Too Large", message))
        self.channel.loseConnection()  # type: ignore[union-attr]

    def gotLength(self, length: int | None) -> None:
        limit = self._limit()
        if limit and length is not None and length > limit:
            self._reject()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._rejected:
            return
        self._received += len(data)
        limit = self._limit()
        if limit and self._received > limit:
            self._reject()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._rejected:
            return
        super().requestReceived(command, path, version)


class GatewaySite(Site):
    """A ``Site`` with a body limit, a connection cap and optional access logging."""

    requestFactory = LimitedRequest

    def __init__(
        self,
        resource: Any,
        *,
        max_body_bytes: int,
        max_connections: int = 0,
        access_log: bool = False,
    ) -> None:
        # No form parsing: twisted.web would parse every POST's Content-Type with
        # the email package looking for form data (~100 µs a request); bodies are JSON.
        super().__init__(resource, parsePOSTFormSubmission=False)
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.access_log = access_log
        self.connections = 0
        self.noisy = False

    def buildProtocol(self, addr: Any) -> Any:
        if self.max_connections and self.connections >= self.max_connections:
            return None  # refused: the reactor closes the socket at once
        proto = super().buildProtocol(addr)
        if proto is not None:
            self.connections += 1
            lost = proto.connectionLost

            def connectionLost(reason: Any, _lost: Any = lost) -> None:
                self.connections -= 1
                _lost(reason)

            proto.connectionLost = connectionLost  # type: ignore[method-assign]
        return proto

    def log(self, request: Any) -> None:
        if self.access_log:
            super().log(request)
