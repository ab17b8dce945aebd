"""The Agent-based upstream client (the supervisor's try-it proxy) and its quiet pool."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived
from twisted.web.client import Agent

from mortred_twisted.http11.upstream import UpstreamClient, UpstreamTimeout, quiet_pool


class HangsThenWrappedCancel:
    """Like the real Agent: a cancelled request fails with ResponseNeverReceived."""

    def request(self, method: bytes, url: bytes, *a: Any, **kw: Any) -> Any:
        def cancel(d: defer.Deferred[Any]) -> None:
            d.errback(ResponseNeverReceived([Failure(defer.CancelledError())]))

        return defer.Deferred(cancel)


def test_wrapped_cancel_is_a_cancel_not_502() -> None:
    """A cancel reported as ResponseNeverReceived([CancelledError]) stays a cancel."""
    client = UpstreamClient(HangsThenWrappedCancel(), Clock(), recv_timeout_s=5)
    d = client.request("GET", "http://127.0.0.1:18100/jobs/x/wait", {})
    failures: list[Any] = []
    d.addErrback(failures.append)
    d.cancel()
    assert failures[0].check(defer.CancelledError)


def test_wrapped_cancel_on_deadline_is_504() -> None:
    """The same wrapped cancel caused by the receive deadline is an UpstreamTimeout."""
    clock = Clock()
    client = UpstreamClient(HangsThenWrappedCancel(), clock, recv_timeout_s=1)
    failures: list[Any] = []
    client.request("GET", "http://127.0.0.1:18100/jobs/x", {}).addErrback(failures.append)
    clock.advance(1)
    assert failures[0].check(UpstreamTimeout)


def test_quiet_pool_logs_no_line_per_connection() -> None:
    """Connections opened through the quiet pool do not log "Starting factory"."""
    reactor = MemoryReactorClock()
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        Agent(reactor, pool=quiet_pool(reactor)).request(b"GET", b"http://127.0.0.1:18100/x")
        _h, _p, factory, _t, _b = reactor.tcpClients[0]
        factory.doStart()
        factory.doStop()
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert not [e for e in events if "factory" in formatEvent(e).lower()]
