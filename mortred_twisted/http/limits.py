"""Request-body size limit enforced before the body is read (HTTP 413).

twisted.web reads a whole request body before any resource runs and has no size
limit. :class:`LimitedRequest` (installed as the ``Site``'s ``requestFactory``)
checks the declared ``Content-Length`` as soon as the headers are in, and counts
the bytes of a chunked body as they arrive. Past the limit, it asks the site's
``early_reject`` policy for the response (so the documented pre-check order
405 → 401 → 415 → 413 still holds), writes it, and closes the connection without
reading the rest; no ``100 Continue`` is sent and no route runs. The site can also
cap the number of open connections (``max_connections``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES, Headers, datetimeToString
from twisted.web.server import Request, Site, version


@dataclass(frozen=True)
class EarlyResponse:
    """A complete response decided from the request line and headers alone."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


#: (method, path, headers, declared or observed body length) -> response
EarlyReject = Callable[[bytes, bytes, Headers, int], EarlyResponse]


class LimitedSite(Site):
    """A ``Site`` whose requests enforce ``body_limit`` bytes via ``early_reject``."""

    def __init__(
        self,
        resource,
        body_limit: int,
        early_reject: EarlyReject,
        *,
        access_log: bool = False,
        on_finished: Callable[[Request], None] | None = None,
        max_connections: int = 0,
    ) -> None:
        # parsePOSTFormSubmission=False: twisted.web would parse every POST's
        # Content-Type with the email package looking for form data (a large share
        # of a submit's CPU here); our bodies are JSON.
        super().__init__(resource, requestFactory=LimitedRequest, parsePOSTFormSubmission=False)
        self.body_limit = body_limit
        self.early_reject = early_reject
        self.access_log = access_log
        self.on_finished = on_finished
        self.max_connections = max_connections
        self.connections = 0
        self.noisy = False
        self._active: set[Request] = set()
        self._idle_waiters: list[Deferred[None]] = []

    def buildProtocol(self, addr: Any) -> Any:
        """Refuse a connection beyond ``max_connections`` open ones (0 = no cap): the
        reactor closes the socket at once."""
        if self.max_connections and self.connections >= self.max_connections:
            return None
        proto = super().buildProtocol(addr)
        if proto is not None:
            self.connections += 1
            lost = proto.connectionLost

            def connectionLost(reason: Any, _lost: Any = lost) -> None:
                self.connections -= 1
                _lost(reason)

            proto.connectionLost = connectionLost
        return proto

    @property
    def active_requests(self) -> int:
        return len(self._active)

    def _track(self, request: Request) -> None:
        self._active.add(request)
        request.notifyFinish().addBoth(lambda _: self._untrack(request))

    def _untrack(self, request: Request) -> None:
        self._active.discard(request)
        if not self._active:
            waiters, self._idle_waiters = self._idle_waiters, []
            for d in waiters:
                d.callback(None)

    def when_idle(self) -> Deferred[None]:
        """Fires once no request is being processed (at once if none is)."""
        if not self._active:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._idle_waiters.append(d)
        return d

    def log(self, request) -> None:
        """Called by twisted.web when a response is finished: the metrics hook.

        Per-request access logging costs a lot on the reactor thread; metrics count
        requests instead. Opt in with ``access_log=True``.
        """
        if self.on_finished is not None:
            self.on_finished(request)
        if self.access_log:
            super().log(request)


_date_cache: list[Any] = [0, b""]


def http_date() -> bytes:
    """The ``Date`` header value, formatted once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = datetimeToString(now)
    return _date_cache[1]


class LimitedRequest(Request):
    """See the module docstring. Only meaningful under a :class:`LimitedSite`.

    When the site's root resource declares ``matches_paths_itself = True`` (a leaf
    that dispatches on ``request.path``: the model server's ``FastRoutes``, the
    gateway's root), :meth:`process` renders it directly: no per-segment unquoting
    into ``postpath``, no resource traversal, and a ``Date`` formatted once a second.
    Such a root must set ``prepath``/``postpath`` itself before delegating to a
    resource that reads them. Any other root gets twisted.web's ``process``.
    """

    _rejected = False
    _received = 0

    def _limit(self) -> int | None:
        site = getattr(self.channel, "site", None)
        return getattr(site, "body_limit", None)

    def gotLength(self, length: int | None) -> None:
        limit = self._limit()
        if limit is not None and length is not None and length > limit:
            self._reject(length)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self._rejected:
            return
        self._received += len(data)
        limit = self._limit()
        if limit is not None and self._received > limit:
            self._reject(self._received)
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        site = self.channel.site
        root = site.resource
        if not getattr(root, "matches_paths_itself", False) or self.path == b"*":
            super().process()
            return
        self.site = site
        self.sitepath = []
        self.setHeader(b"Server", version)
        self.setHeader(b"Date", http_date())
        self.prepath = []
        self.postpath = []
        try:
            self.render(root)
        except BaseException:
            self.processingFailed(Failure())

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._rejected:
            return
        site = getattr(self.channel, "site", None)
        if isinstance(site, LimitedSite):
            site._track(self)
        super().requestReceived(command, path, version)

    def _reject(self, length: int) -> None:
        self._rejected = True
        # The channel answers "Expect: 100-continue" right after gotLength(); the
        # client must get our final answer instead of an invitation to upload.
        self.requestHeaders.removeHeader(b"expect")
        channel = self.channel
        method = getattr(channel, "_command", b"") or b""
        path = getattr(channel, "_path", b"") or b""
        response = channel.site.early_reject(method, path, self.requestHeaders, length)
        reason = RESPONSES.get(response.status, b"Error")
        if response.status == 422:
            reason = b"Unprocessable Entity"
        lines = [b"HTTP/1.1 %d %s" % (response.status, reason)]
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "Cache-Control": "no-store",
            **response.headers,
            "Content-Length": str(len(response.body)),
            "Connection": "close",
        }
        lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
        channel.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + response.body)
        channel.transport.loseConnection()
        # Keep the content file valid for twisted's bookkeeping if more bytes arrive.
        super().gotLength(0)
