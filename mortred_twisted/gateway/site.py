"""The gateway's ``Site``: 413 right after the headers, and a connection cap (edge).

twisted.web reads a whole body before any route runs, so the size limit lives in
the ``Request``: the shared :class:`~mortred_twisted.http.limits.LimitedSite` answers
413 as soon as a ``Content-Length`` over the limit is seen (no ``100 Continue`` is
sent) or a chunked body grows past it, and closes the connection; the route never
runs and nothing is forwarded. This module adds the gateway's 413 body and a cap on
concurrent connections.
"""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.python.failure import Failure
from twisted.web.http import Headers, datetimeToString
from twisted.web.server import version

from mortred_twisted.http.limits import EarlyResponse, LimitedRequest, LimitedSite

_date_cache: list[Any] = [0, b""]


def http_date() -> bytes:
    """The ``Date`` header value, formatted once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = datetimeToString(now)
    return _date_cache[1]


class GatewayRequest(LimitedRequest):
    """A :class:`LimitedRequest` whose ``process`` skips resource traversal when the
    site's root is a leaf that matches paths itself (the gateway's
    :class:`~mortred_twisted.http.gateway.GatewayResource`): no per-segment unquoting
    of ``postpath``, no ``getResourceFor``, a ``Date`` formatted once per second.
    Any other root gets twisted.web's ``process`` unchanged."""

    def process(self) -> None:
        site = self.channel.site
        root = site.resource
        if not getattr(root, "matches_paths_itself", False) or self.path == b"*":
            super().process()
            return
        self.site = site
        self.setHeader(b"Server", version)
        self.setHeader(b"Date", http_date())
        self.prepath = []
        self.postpath = []
        try:
            self.render(root)
        except BaseException:
            self.processingFailed(Failure())


class GatewaySite(LimitedSite):
    """A ``Site`` with a body limit, a connection cap and optional access logging."""

    def __init__(
        self,
        resource: Any,
        *,
        max_body_bytes: int,
        max_connections: int = 0,
        access_log: bool = False,
    ) -> None:
        super().__init__(resource, max_body_bytes, self._too_large, access_log=access_log)
        self.requestFactory = GatewayRequest
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.connections = 0

    def _too_large(
        self, method: bytes, path: bytes, headers: Headers, length: int
    ) -> EarlyResponse:
        message = f"request entity too large (limit {self.max_body_bytes} bytes)"
        return EarlyResponse(413, json.dumps({"error": message}).encode("utf-8"))

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
