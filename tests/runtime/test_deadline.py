"""within(): a Deferred raced against a reactor timer, owning or not owning the loser."""

from __future__ import annotations

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock

from mortred_twisted.runtime.deadline import DeadlineExpired, within


def outcome(d: Deferred) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


def test_result_before_the_deadline_passes_through_and_stops_the_timer() -> None:
    """A Deferred that fires in time gives its result; no timer is left behind."""
    clock = Clock()
    d: Deferred[int] = Deferred()
    got = outcome(within(clock, d, 5.0, cancel_on_expiry=True))
    d.callback(7)
    assert got == [7] and clock.getDelayedCalls() == []


def test_expiry_cancels_the_loser_when_asked() -> None:
    """With cancel_on_expiry the raced Deferred is cancelled (a queued acquire leaves)."""
    clock = Clock()
    cancelled: list = []
    d: Deferred[int] = Deferred(lambda _d: cancelled.append(True))
    got = outcome(within(clock, d, 1.0, cancel_on_expiry=True))
    clock.advance(1.0)
    assert got[0].check(DeadlineExpired) and cancelled == [True]


def test_expiry_leaves_a_running_thread_alone_and_drops_its_late_result() -> None:
    """Without cancel_on_expiry the raced Deferred keeps running; its own callbacks still
    see the late result (the lease is released when the thread returns)."""
    clock = Clock()
    expired: list = []
    d: Deferred[int] = Deferred()
    released = outcome(d)
    got = outcome(
        within(clock, d, 1.0, cancel_on_expiry=False, on_expiry=lambda: expired.append(1))
    )
    clock.advance(1.0)
    assert got[0].check(DeadlineExpired) and expired == [1] and released == []
    d.callback(3)
    assert released == [3] and len(got) == 1


def test_cancelling_the_race_cancels_the_timer() -> None:
    """A client that goes away cancels the race: the timer goes, and the loser if owned."""
    clock = Clock()
    cancelled: list = []
    d: Deferred[int] = Deferred(lambda _d: cancelled.append(True))
    race = within(clock, d, 30.0, cancel_on_expiry=True)
    race.addErrback(lambda f: f.trap(CancelledError))
    race.cancel()
    assert clock.getDelayedCalls() == [] and cancelled == [True]


def test_no_deadline_returns_the_deferred_itself() -> None:
    """seconds=None means no timer at all."""
    clock = Clock()
    d: Deferred[int] = Deferred()
    assert within(clock, d, None, cancel_on_expiry=True) is d
    assert clock.getDelayedCalls() == []
