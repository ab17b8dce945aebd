"""ColdStart on task.Clock: held requests share one wake, bounds by count and time,
Retry-After from the measured start-up time, a request is held once."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.config.control import AutoscaleSettings
from mortred_twisted.gateway.cold_start import HELD, ColdStart, Woken
from mortred_twisted.gateway.routing import Route, RouteKind

SETTINGS = AutoscaleSettings(
    min_replicas=0, max_replicas=2, cold_start_max_waiting=2, cold_start_timeout_s=10
)


def entry(autoscale: AutoscaleSettings | None = SETTINGS, name: str = "M") -> CatalogEntry:
    return CatalogEntry(
        name, "fake", "127.0.0.1", 18100, f"/{name}", True, 16, "m.toml",
        job_store="redis", replicas=2, autoscale=autoscale,
    )  # fmt: skip


class Rig:
    def __init__(self) -> None:
        self.clock = Clock()
        self.calls: list[defer.Deferred[Woken]] = []
        self.catalog = Catalog([entry(), entry(None, "F")])
        self.cold = ColdStart(self.catalog, self.wake, self.clock)
        self.retried: list[Route] = []
        self.refusals: list[tuple[str, int]] = []

    def wake(self, model_id: str) -> defer.Deferred[Woken]:
        d: defer.Deferred[Woken] = defer.Deferred()
        self.calls.append(d)
        return d

    def hold(self, model_id: str = "M") -> tuple[defer.Deferred[bytes], list[Any]]:
        route = Route(RouteKind.SUBMIT, self.catalog[model_id], "/jobs")
        d = self.cold.hold(route, self.retry, self.refuse)
        out: list[Any] = []
        d.addBoth(out.append)
        return d, out

    def retry(self, route: Route) -> defer.Deferred[bytes]:
        self.retried.append(route)
        return defer.succeed(b"forwarded")

    def refuse(self, message: str, retry_after_s: int) -> bytes:
        self.refusals.append((message, retry_after_s))
        return b"503"


def test_each_held_request_wakes_and_goes_to_the_woken_replica() -> None:
    """Two held requests, two wake calls (the supervisor counts each as load); both
    are forwarded to the URL they name, as routes marked held (never held again)."""
    rig = Rig()
    _d1, out1 = rig.hold()
    _d2, out2 = rig.hold()
    assert len(rig.calls) == 2 and rig.cold.waiting["M"] == 2
    for call in rig.calls:
        call.callback(Woken("http://127.0.0.1:18101", 1.5))
    assert out1 == out2 == [b"forwarded"]
    assert [r.url for r in rig.retried] == ["http://127.0.0.1:18101/jobs"] * 2
    assert all(HELD in r.tried and not rig.cold.covers(r) for r in rig.retried)
    assert rig.cold.waiting["M"] == 0
    assert rig.cold.retry_after_s("M") == 2


def test_beyond_the_count_is_503_at_once_and_beyond_the_time_too() -> None:
    """A third request over cold_start_max_waiting (2) is refused at once; the held
    ones are refused after cold_start_timeout_s, with Retry-After."""
    rig = Rig()
    rig.hold()
    rig.hold()
    _d, out = rig.hold()
    assert out == [b"503"] and rig.refusals[0][1] == 10
    rig.clock.advance(10)
    assert len(rig.refusals) == 3
    assert rig.cold.waiting["M"] == 0
    assert all(call.called for call in rig.calls)  # timed-out wake calls cancelled


def test_a_client_that_leaves_frees_its_place() -> None:
    """Cancelling a held request (the client went away) releases its place."""
    rig = Rig()
    d, out = rig.hold()
    d.cancel()
    assert rig.cold.waiting["M"] == 0
    assert out[0].check(defer.CancelledError)
    assert rig.calls[0].called  # its wake call was cancelled too
    assert rig.retried == []


def test_a_refused_wake_is_503_with_the_supervisors_retry_after() -> None:
    """The supervisor found no replica ready (or refused): 503, Retry-After from it."""
    rig = Rig()
    _d, out = rig.hold()
    rig.calls[0].callback(Woken(None, 4.2))
    assert out == [b"503"] and rig.refusals[0][1] == 5


def test_only_autoscaled_ids_are_covered() -> None:
    """A fixed-count id is never held."""
    rig = Rig()
    assert not rig.cold.covers(Route(RouteKind.INFER, rig.catalog["F"], "/F"))
    assert rig.cold.covers(Route(RouteKind.INFER, rig.catalog["M"], "/M"))


class Answer:
    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.body = body


def test_a_not_ready_503_of_an_autoscaled_replica_counts_as_refused() -> None:
    """A draining or starting replica's "not ready" 503 (code 65) raises
    UpstreamUnavailable for an autoscaled id; other answers and ids pass."""
    import pytest

    from mortred_twisted.http11.upstream import UpstreamUnavailable

    rig = Rig()
    scaled = Route(RouteKind.INFER, rig.catalog["M"], "/M")
    fixed = Route(RouteKind.INFER, rig.catalog["F"], "/F")
    stopping = Answer(503, b'{"req_id":"r","code":65,"msg":"model not ready (stopping)"}')
    with pytest.raises(UpstreamUnavailable):
        rig.cold.refuse_not_ready(stopping, scaled)
    assert rig.cold.refuse_not_ready(stopping, fixed) is stopping
    busy = Answer(503, b'{"error":"budget","code":66}')
    assert rig.cold.refuse_not_ready(busy, scaled) is busy
    ok = Answer(200, b"{}")
    assert rig.cold.refuse_not_ready(ok, scaled) is ok
