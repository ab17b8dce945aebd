"""NamedCounters: Workflow's named counter on the reactor thread."""

from __future__ import annotations

from twisted.internet.defer import CancelledError

from mortred_twisted.runtime.counters import NamedCounters


def fired(d) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


def test_counter_fires_after_target_counts() -> None:
    """A counter with target 2 fires on the second count, not the first."""
    counters = NamedCounters()
    got = fired(counters.counter("job_1", target=2))
    assert counters.count_by_name("job_1") == 0
    assert got == []
    assert counters.count_by_name("job_1") == 1
    assert got == ["job_1"]
    assert len(counters) == 0


def test_counts_go_to_counters_in_creation_order() -> None:
    """With an int n, counts go to the oldest counter first (Workflow semantics)."""
    counters = NamedCounters()
    first, second = fired(counters.counter("a")), fired(counters.counter("a"))
    assert counters.count_by_name("a", 1) == 1
    assert first == ["a"] and second == []
    assert counters.waiting("a") == 1


def test_count_all_wakes_every_waiter() -> None:
    """n=None counts every counter of the name once: all waiters of a job wake."""
    counters = NamedCounters()
    waiters = [fired(counters.counter("job")) for _ in range(5)]
    other = fired(counters.counter("other"))
    assert counters.count_by_name("job", None) == 5
    assert all(w == ["job"] for w in waiters)
    assert other == [] and counters.waiting("other") == 1


def test_count_on_unknown_name_is_a_noop() -> None:
    """Counting a name nobody waits on does nothing and registers nothing."""
    counters = NamedCounters()
    assert counters.count_by_name("nobody", None) == 0
    assert len(counters) == 0


def test_cancelled_waiter_leaves_the_registry() -> None:
    """Cancelling a waiter's Deferred removes its counter; the others still wake."""
    counters = NamedCounters()
    d = counters.counter("job")
    keep = fired(counters.counter("job"))
    errors: list = []
    d.addErrback(lambda f: errors.append(f.check(CancelledError)))
    d.cancel()
    assert errors == [CancelledError]
    assert counters.waiting("job") == 1
    counters.count_by_name("job", None)
    assert keep == ["job"]
    assert len(counters) == 0


def test_cancelling_last_waiter_leaves_no_leak() -> None:
    """After every waiter of a name is cancelled, the name is gone."""
    counters = NamedCounters()
    ds = [counters.counter("job") for _ in range(3)]
    for d in ds:
        d.addErrback(lambda f: None)
        d.cancel()
    assert len(counters) == 0


def test_callback_may_register_a_new_counter() -> None:
    """A waiter that re-arms from its callback is not woken by the same count."""
    counters = NamedCounters()
    rearmed: list = []

    def rearm(name: str) -> None:
        rearmed.append(fired(counters.counter(name)))

    counters.counter("j").addCallback(rearm)
    counters.count_by_name("j", None)
    assert rearmed and rearmed[0] == []
    assert counters.waiting("j") == 1
