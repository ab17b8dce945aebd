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
from typing import Any

from twisted.web.http import Headers

from mortred_twisted.http.limits import EarlyResponse, LimitedSite


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
        super().__init__(
            resource, max_body_bytes, self._too_large, access_log=access_log,
            max_connections=max_connections,
        )  # fmt: skip
        self.max_body_bytes = max_body_bytes

    def _too_large(
        self, method: bytes, path: bytes, headers: Headers, length: int
    ) -> EarlyResponse:
        message = f"request entity too large (limit {self.max_body_bytes} bytes)"
        return EarlyResponse(413, json.dumps({"error": message}).encode("utf-8"))
