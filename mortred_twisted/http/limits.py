"""The model port's ``Site``: framing rules, a body limit (413), a read deadline (408),
a connection cap, and the requests in flight (for a graceful stop).

twisted.web reads a whole request body before any resource runs and has no size
limit. :class:`LimitedSite` builds :class:`~mortred_twisted.http.framing.FramingChannel`
channels (``Site.protocol``, public API), which refuse a declared ``Content-Length``
over ``body_limit`` as soon as the headers are in, asking the site's
``early_reject`` policy for the answer (so the documented pre-check order
405 → 401 → 415 → 413 holds): no ``100 Continue`` is sent and no route runs.
:class:`LimitedRequest` counts a chunked body as it arrives and has the channel refuse
it the same way once it passes the limit. Nothing here reads or writes a private
attribute of Twisted (docs/architecture.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from twisted.web.http import datetimeToString
from twisted.web.server import Request, Site, version

from mortred_twisted.http.envelope import new_request_id
from mortred_twisted.http.framing import EarlyResponse, FramingChannel

__all__ = ["EarlyReject", "EarlyResponse", "LimitedRequest", "LimitedSite"]

#: Seconds a connection may stay silent between requests (twisted.web's default).
IDLE_TIMEOUT_S = 60 * 60 * 12
#: (method, target, headers, declared or observed body length) -> response
EarlyReject = Callable[[bytes, bytes, Any, int], EarlyResponse]


class LimitedSite(Site):
    """A ``Site`` whose channels apply :mod:`~mortred_twisted.http.framing`'s rules and
    ``body_limit``; see the module docstring.

    Deadlines without a timer per request: ``read_timeout_s`` (0 = none) bounds the
    time from a request's first byte until its head and body are in (408), and a
    connection whose client sent nothing for ``idle_timeout_s`` (0 = none), between
    requests or mid-request, is closed (twisted.web's own idle timer, 12 hours by
    default, is off: it re-armed a reactor timer twice per request). One sweep every
    quarter of the shorter deadline (at most 1 s) checks every connection, so a
    deadline is met within a quarter of it."""

    protocol = FramingChannel

    def __init__(
        self,
        resource: Any,
        body_limit: int,
        early_reject: EarlyReject,
        *,
        access_log: bool = False,
        on_finished: Callable[[Request], None] | None = None,
        max_connections: int = 0,
        read_timeout_s: float = 60.0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        reactor: Any = None,
    ) -> None:
        # parsePOSTFormSubmission=False: twisted.web would parse every POST's
        # Content-Type with the email package looking for form data (a large share
        # of a submit's CPU here); our bodies are JSON.
        super().__init__(
            resource,
            requestFactory=LimitedRequest,
            parsePOSTFormSubmission=False,
            reactor=reactor,
            timeout=None,
        )
        self.body_limit = body_limit
        self.early_reject = early_reject
        self.read_timeout_s = read_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.access_log = access_log
        self.on_finished = on_finished
        self.max_connections = max_connections
        self.connections = 0
        self.channels: set[FramingChannel] = set()
        self._sweeper: LoopingCall | None = None
        self.noisy = False
        self._active: set[Request] = set()
        self._idle_waiters: list[Deferred[None]] = []

    @staticmethod
    def request_id() -> str:
        """The ``X-Request-ID`` of an answer written before any route ran."""
        return new_request_id()

    def buildProtocol(self, addr: Any) -> Any:
        """Refuse a connection beyond ``max_connections`` open ones (0 = no cap): the
        reactor closes the socket at once."""
        if self.max_connections and self.connections >= self.max_connections:
            return None
        return super().buildProtocol(addr)

    def channel_opened(self, channel: FramingChannel) -> None:
        self.connections += 1
        self.channels.add(channel)

    def channel_closed(self, channel: FramingChannel) -> None:
        self.connections -= 1
        self.channels.discard(channel)

    def sweep(self) -> None:
        """Answer 408 to every request still being read ``read_timeout_s`` after its
        first byte, and close connections idle for ``idle_timeout_s``
        (:meth:`FramingChannel.expire`)."""
        now = self.reactor.seconds()
        reading = now - self.read_timeout_s if self.read_timeout_s > 0 else None
        idle = now - self.idle_timeout_s if self.idle_timeout_s > 0 else None
        for channel in list(self.channels):
            channel.expire(reading, idle)

    def startFactory(self) -> None:
        super().startFactory()
        deadlines = [t for t in (self.read_timeout_s, self.idle_timeout_s) if t > 0]
        if deadlines and self._sweeper is None:
            self._sweeper = LoopingCall(self.sweep)
            self._sweeper.clock = self.reactor
            self._sweeper.start(min(1.0, min(deadlines) / 4), now=False)

    def stopFactory(self) -> None:
        if self._sweeper is not None:
            if self._sweeper.running:
                self._sweeper.stop()
            self._sweeper = None
        super().stopFactory()

    @property
    def active_requests(self) -> int:
        return len(self._active)

    def track(self, request: Request) -> None:
        """Count ``request`` as in flight until it finishes or its client goes away."""
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

    def log(self, request: Request) -> None:
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
    """A request that counts its body against the site's ``body_limit`` (a chunked
    body has no declared length) and registers with the site while in flight.
    Only meaningful on a :class:`LimitedSite`'s channel.

    :meth:`process` (public ``Request`` API) renders a root that declares
    ``matches_paths_itself = True`` (a leaf dispatching on ``request.path``: the model
    server's ``FastRoutes``) directly: no per-segment unquoting into ``postpath``, no
    traversal, a ``Date`` formatted once a second (about 5 µs of a poll's ~50 µs of
    server CPU in process, measured). Such a root must set ``postpath`` itself before
    delegating to a resource that reads it. Any other root, and ``*``, get
    twisted.web's ``process``.
    """

    received = 0

    def process(self) -> None:
        site = self.channel.site
        root = site.resource
        if not getattr(root, "matches_paths_itself", False) or self.path == b"*":
            super().process()
            return
        self.site = site
        self.sitepath = []
        self.prepath = []
        self.postpath = []
        self.setHeader(b"Server", version)
        self.setHeader(b"Date", http_date())
        try:
            self.render(root)
        except BaseException:
            self.processingFailed(Failure())

    def handleContentChunk(self, data: bytes) -> None:
        channel = self.channel
        if channel is None or channel.refused:
            return
        self.received += len(data)
        limit = getattr(channel.site, "body_limit", None)
        if limit is not None and self.received > limit:
            channel.refuse_too_large(self.received)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        site = self.channel.site
        if isinstance(site, LimitedSite):
            site.track(self)
        super().requestReceived(command, path, version)
