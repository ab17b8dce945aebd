"""The upstream failure types, and the Agent-based client the supervisor's proxy uses.

The gateway forwards with :class:`~mortred_twisted.http11.pool.LeanUpstreamClient`
(same contract, ~4x less CPU); the supervisor's try-it proxy uses
:class:`UpstreamClient` (a ``twisted.web.client.Agent``, public API only). Reactor
thread only. Failures map to the gateway's status codes in one place:

* connection refused / host unreachable / connect timeout → :class:`UpstreamUnavailable` (503)
* the response did not complete within ``recv_timeout_s`` → :class:`UpstreamTimeout` (504)
* any other transport failure → :class:`UpstreamTransportError` (502)

Cancelling the Deferred returned by :meth:`UpstreamClient.request` (the gateway does it
when the client disconnects) aborts the upstream request and its connection.

Why the bare ``Agent`` and not ``treq.HTTPClient.request`` for forwarding: treq is the
same Agent and pool underneath, but per request it re-normalizes the URL through
hyperlink/IDNA, keeps one cookie jar for every client (a model's ``Set-Cookie`` would
leak between callers), follows redirects and wraps a gzip decoder (a proxy must pass
3xx and encodings through). Tests drive the same code with
``treq.testing.RequestTraversalAgent``; the supervisor's probes use treq.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer, error
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.web.client import HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer


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
    """A complete upstream response (body read once, into one buffer).

    ``headers`` is a ``Headers`` (Agent client) or a :class:`~.pool.RawHeaders` (lean
    client); both offer ``getRawHeaders`` and ``getAllRawHeaders``.
    """

    code: int
    headers: Any
    body: bytes


@implementer(IBodyProducer)
class BytesProducer:
    """A body already in memory: written in one call, length known."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> defer.Deferred[None]:
        consumer.write(self.body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


_UNAVAILABLE = (
    error.ConnectionRefusedError,
    error.ConnectError,
    error.DNSLookupError,
    error.NoRouteError,
)


def _cancelled(failure: Any) -> bool:
    """True for a cancellation, bare or wrapped the way the Agent reports it
    (``ResponseNeverReceived([CancelledError])`` and friends)."""
    if failure.check(defer.CancelledError):
        return True
    reasons = getattr(failure.value, "reasons", None) or []
    return any(r.check(defer.CancelledError) for r in reasons)


@implementer(IStreamClientEndpoint)
class _QuietEndpoint:
    """An endpoint whose connections' factories do not log "Starting factory"."""

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self._endpoint = endpoint

    def connect(self, protocolFactory: Any) -> defer.Deferred[Any]:
        protocolFactory.noisy = False
        return self._endpoint.connect(protocolFactory)

    def __repr__(self) -> str:
        return repr(self._endpoint)


class QuietPool(HTTPConnectionPool):
    """An ``HTTPConnectionPool`` that does not log every connection it opens (through
    its public ``getConnection``: each new connection's factory gets
    ``noisy = False``)."""

    def getConnection(self, key: Hashable, endpoint: IStreamClientEndpoint) -> Any:
        return super().getConnection(key, _QuietEndpoint(endpoint))


def quiet_pool(reactor: Any, *, persistent: bool = True) -> HTTPConnectionPool:
    """A :class:`QuietPool`."""
    return QuietPool(reactor, persistent=persistent)


class UpstreamClient:
    """Forwards one request and returns the whole response, with a deadline.

    :param agent: an ``IAgent`` (a pooled ``Agent``; ``RequestTraversalAgent`` in tests).
    :param clock: schedules the receive deadline (the reactor, or ``task.Clock``).
    :param pool: closed by :meth:`close`; None when the agent owns nothing.
    """

    def __init__(
        self,
        agent: Any,
        clock: IReactorTime,
        *,
        recv_timeout_s: float,
        pool: HTTPConnectionPool | None = None,
    ) -> None:
        self._agent = agent
        self._clock = clock
        self._pool = pool
        self.recv_timeout_s = recv_timeout_s

    def request(
        self,
        method: str,
        url: str,
        headers: dict[bytes, list[bytes]],
        body: IBodyProducer | bytes | None = None,
    ) -> defer.Deferred[UpstreamResponse]:
        """Send and read the whole response; errbacks with an :class:`UpstreamError`,
        or ``CancelledError`` when the caller cancelled."""
        timed_out = [False]
        if isinstance(body, bytes):
            body = BytesProducer(body)
        d = self._agent.request(method.encode("ascii"), url.encode("ascii"), Headers(headers), body)

        def read(response: Any) -> defer.Deferred[UpstreamResponse]:
            got = readBody(response)
            got.addCallback(lambda b: UpstreamResponse(response.code, response.headers, b))
            return got

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
            message = failure.getErrorMessage() or failure.type.__name__
            raise UpstreamTransportError(f"upstream transport failure: {message}")

        d.addBoth(done)
        d.addErrback(classify)
        return d

    def close(self) -> defer.Deferred[None]:
        """Close pooled connections (service shutdown)."""
        if self._pool is None:
            return defer.succeed(None)
        return self._pool.closeCachedConnections()
