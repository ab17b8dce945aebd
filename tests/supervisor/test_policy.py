"""Restart policy: on-failure/always/no, doubling backoff, crash-loop give-up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mortred_twisted.supervisor.policy import ExitStatus, RestartTracker

CRASH = ExitStatus(code=1)
CLEAN = ExitStatus(code=0)
KILLED = ExitStatus(signal=9)


def test_on_failure_restarts_failures_only() -> None:
    """on-failure restarts a crash or a kill, not a clean exit."""
    t = RestartTracker("on-failure")
    assert t.on_exit(CRASH, 0).restart
    assert t.on_exit(KILLED, 100).restart
    assert not t.on_exit(CLEAN, 200).restart


def test_always_and_no() -> None:
    """always restarts a clean exit; no never restarts."""
    assert RestartTracker("always").on_exit(CLEAN, 0).restart
    assert not RestartTracker("no").on_exit(CRASH, 0).restart


def test_backoff_doubles_then_gives_up() -> None:
    """Delays 0.5, 1, 2, 4, 8 s; the 6th crash within 60 s gives up."""
    t = RestartTracker("on-failure")
    delays = []
    now = 0.0
    for _ in range(5):
        d = t.on_exit(CRASH, now)
        assert d.restart
        delays.append(d.delay)
        now += d.delay + 0.1
    assert delays == [0.5, 1, 2, 4, 8]
    final = t.on_exit(CRASH, now)
    assert not final.restart and final.give_up and "crash loop" in final.reason


def test_window_forgets_old_restarts() -> None:
    """A child that stayed up past the 60 s window starts again from 0.5 s."""
    t = RestartTracker("on-failure")
    t.on_exit(CRASH, 0)
    t.on_exit(CRASH, 1)
    assert t.on_exit(CRASH, 200).delay == 0.5


def test_backoff_caps_at_30s() -> None:
    """The delay never exceeds 30 s even with a large give-up limit."""
    t = RestartTracker("always", max_restarts=100, window=10_000)
    delays = [t.on_exit(CRASH, i).delay for i in range(12)]
    assert max(delays) == 30 and delays[-1] == 30


def test_reset_allows_restart_after_give_up() -> None:
    """An operator's start (reset) clears the crash loop."""
    t = RestartTracker("on-failure")
    for i in range(5):
        t.on_exit(CRASH, i)
    assert t.on_exit(CRASH, 5).give_up
    t.reset()
    assert t.on_exit(CRASH, 6).restart


def test_unknown_policy() -> None:
    """A typo in the policy is refused."""
    with pytest.raises(ValueError):
        RestartTracker("sometimes")


@given(st.lists(st.floats(min_value=0, max_value=5), max_size=40))
def test_never_more_than_five_restarts_per_window(gaps: list[float]) -> None:
    """Whatever the crash timing, no 60 s window holds more than 5 restarts."""
    t = RestartTracker("always")
    now = 0.0
    accepted = []
    for gap in gaps:
        now += gap
        if t.on_exit(CRASH, now).restart:
            accepted.append(now)
    for i, start in enumerate(accepted):
        assert sum(1 for x in accepted[i:] if x - start < 60) <= 5
