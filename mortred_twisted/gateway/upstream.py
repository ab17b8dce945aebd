"""The gateway's upstream client: treq over a persistent connection pool (reactor).

One :class:`UpstreamClient` per gateway process, used on the reactor thread only. It
owns the ``HTTPConnectionPool`` (``maxPersistentPerHost`` raised from treq's 2) and
maps failures to the gateway's status codes in one place:

* connection refused / host unreachable / connect timeout → :class:`UpstreamUnavailable` (503)
* the response did not complete within ``recv_timeout_s`` → :class:`UpstreamTimeout` (504)
* any other transport failure → :class:`UpstreamTransportError` (502)

Cancelling the Deferred returned by :meth:`UpstreamClient.request` (Klein does it when
the client disconnects) aborts the upstream request and its connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any

import treq
from treq.client import HTTPClient
from twisted.internet import defer, error
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator
from twisted.web.client import (
    Agent,
    FileBodyProducer,
    HTTPConnectionPool,
    _HTTP11ClientFactory,
)
from twisted.web.http_headers import Headers

#: Bodies up to this size are sent as bytes (one write); larger ones are streamed
#: from the request's content file by a FileBodyProducer.
STREAM_THRESHOLD = 64 * 1024


class UpstreamError(Exception):
    """A failure the gateway answers itself with :attr:`status`."""

    status = 502

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UpstreamUnavailable(UpstreamError):
    status = 503


class UpstreamTransportError(UpstreamError):
    status = 502


class UpstreamTimeout(UpstreamError):
    status = 504


@dataclass(frozen=True)
class UpstreamResponse:
    """A complete upstream response (body read once, into one buffer)."""

    code: int
    headers: Headers
    body: bytes


_UNAVAILABLE = (
    error.ConnectionRefusedError,
    error.ConnectError,
    error.DNSLookupError,
    error.NoRouteError,
)


class _QuietFactory(_HTTP11ClientFactory):
    """No "Starting/Stopping factory" log line per upstream connection."""

    noisy = False


def _cancelled(failure: Any) -> bool:
    """True for a cancellation, bare or wrapped the way the Agent reports it
    (``ResponseNeverReceived([CancelledError])`` and friends)."""
    if failure.check(defer.CancelledError):
        return True
    reasons = getattr(failure.value, "reasons", None) or []
    return any(r.check(defer.CancelledError) for r in reasons)


def quiet_pool(reactor: Any, *, persistent: bool = True) -> HTTPConnectionPool:
    """An ``HTTPConnectionPool`` that does not log every connection it opens."""
    pool = HTTPConnectionPool(reactor, persistent=persistent)
    pool._factory = _QuietFactory  # type: ignore[attr-defined]
    return pool


def make_http_client(
    reactor: Any, *, max_persistent_per_host: int = 64, connect_timeout_s: float = 30.0
) -> tuple[HTTPClient, HTTPConnectionPool]:
    """A treq client over a persistent pool bound to ``reactor``."""
    pool = quiet_pool(reactor)
    pool.maxPersistentPerHost = max_persistent_per_host
    pool.cachedConnectionTimeout = 120
    agent = Agent(reactor, pool=pool, connectTimeout=connect_timeout_s)
    return HTTPClient(agent), pool


class UpstreamClient:
    """Forwards one request and returns the whole response, with a deadline.

    :param http: a treq ``HTTPClient`` (or ``StubTreq`` in tests).
    :param clock: schedules the receive deadline (the reactor, or ``task.Clock``).
    :param pool: closed by :meth:`close`; None when ``http`` owns nothing.
    """

    def __init__(
        self,
        http: Any,
        clock: IReactorTime,
        *,
        recv_timeout_s: float,
        pool: HTTPConnectionPool | None = None,
    ) -> None:
        self._http = http
        self._clock = clock
        self._pool = pool
        self.recv_timeout_s = recv_timeout_s
        self._cooperator = Cooperator(scheduler=lambda f: clock.callLater(0, f))

    def body_for(self, content: IO[bytes] | None, length: int) -> Any:
        """What to hand treq as ``data``: bytes for small bodies, else a producer."""
        if content is None or length <= 0:
            return None
        content.seek(0)
        if length <= STREAM_THRESHOLD:
            return content.read()
        return FileBodyProducer(content, cooperator=self._cooperator)

    def request(
        self,
        method: str,
        url: str,
        headers: dict[bytes, list[bytes]],
        data: Any = None,
    ) -> defer.Deferred[UpstreamResponse]:
        """Send and read the whole response; errbacks with an :class:`UpstreamError`,
        or ``CancelledError`` when the caller cancelled."""
        timed_out = [False]
        d = self._http.request(method, url, headers=Headers(headers), data=data)

        def read(response: Any) -> defer.Deferred[UpstreamResponse]:
            body = treq.content(response)
            body.addCallback(lambda b: UpstreamResponse(response.code, response.headers, b))
            return body

        d.addCallback(read)

        def on_deadline() -> None:
            timed_out[0] = True
            d.cancel()

        timer = self._clock.callLater(self.recv_timeout_s, on_deadline)

        def done(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        def classify(failure: Any) -> Any:
            if timed_out[0]:
                raise UpstreamTimeout(
                    f"upstream did not answer within {self.recv_timeout_s * 1000:.0f} ms"
                )
            if _cancelled(failure):
                # The caller cancelled (the client went away): nothing to answer.
                raise defer.CancelledError()
            if failure.check(*_UNAVAILABLE):
                raise UpstreamUnavailable(f"model not running ({failure.value})")
            raise UpstreamTransportError(
                f"upstream transport failure: {failure.getErrorMessage() or failure.type.__name__}"
            )

        d.addBoth(done)
        d.addErrback(classify)
        return d

    def close(self) -> defer.Deferred[None]:
        """Close pooled connections (service shutdown)."""
        if self._pool is None:
            return defer.succeed(None)
        return self._pool.closeCachedConnections()
