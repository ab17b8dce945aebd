"""The autoscaling policy on a fake clock: bursts, ramps, oscillation, failures, gaps."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from mortred_twisted.supervisor.autoscale import (
    REASONS,
    AutoscalePolicy,
    AutoscaleSettings,
    Decision,
    Measurement,
)

SETTINGS = AutoscaleSettings(
    min_replicas=1,
    max_replicas=4,
    target_backlog_per_replica=4,
    scale_up_window_s=2,
    scale_down_window_s=10,
    idle_to_zero_s=30,
    max_step=0,
    cooldown_s=3,
)


class Fleet:
    """A policy, a fake clock and a replica count that follows every decision at once
    (replicas start instantly unless ``failing``)."""

    def __init__(self, settings: AutoscaleSettings = SETTINGS, current: int = 1) -> None:
        self.policy = AutoscalePolicy(settings)
        self.now = 0.0
        self.current = current
        self.decisions: list[Decision] = []
        self.failing = False
        self.last_failure: float | None = None
        self.startup_s = 1.0

    def tick(self, backlog: int | None, *, inflight: int = 0, waiting: int = 0) -> Decision:
        m = Measurement(
            backlog=backlog,
            inflight=inflight,
            current=self.current,
            ready=self.current,
            waiting=waiting,
            startup_s=self.startup_s,
            last_start_failure=self.last_failure,
        )
        d = self.policy.decide(m, self.now)
        assert d.reason in REASONS
        self.decisions.append(d)
        if d.desired > self.current and self.failing:
            self.last_failure = self.now  # the new replica exits before it is ready
        else:
            self.current = d.desired
        self.now += 1.0
        return d

    def run(self, backlog: int | None, seconds: int, **kw: int) -> None:
        for _ in range(seconds):
            self.tick(backlog, **kw)

    def changes(self) -> int:
        counts = [d.desired for d in self.decisions]
        return sum(1 for a, b in itertools.pairwise(counts) if a != b)


def test_a_burst_scales_up_after_the_up_window_to_what_it_needs() -> None:
    """A backlog of 200 (50 replicas' worth) held for the up window takes 1 to max (4)
    in one decision, not before the window has passed."""
    f = Fleet()
    f.run(200, 2)
    assert f.current == 1
    assert f.decisions[-1].reason == "waiting_window"
    d = f.tick(200)
    assert (d.desired, d.reason) == (4, "scale_up")


def test_back_down_only_after_the_whole_down_window() -> None:
    """Once the burst is gone, the count stays for the down window, then returns to
    min_replicas."""
    f = Fleet(current=4)
    f.run(0, 10)
    assert f.current == 4
    d = f.tick(0)
    assert (d.desired, d.reason) == (1, "scale_down")


def test_a_ramp_climbs_step_by_step_with_max_step() -> None:
    """A ramp of 2 jobs more a second with max_step 1: the count rises one at a time,
    never above max, never down while the load rises."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "max_step": 1}))
    for second in range(40):
        f.tick(2 * second)
    counts = [d.desired for d in f.decisions]
    assert counts == sorted(counts)
    assert max(counts) == 4
    assert all(abs(b - a) <= 1 for a, b in itertools.pairwise(counts))


def test_oscillating_load_does_not_flap() -> None:
    """A load swinging between 0 and 16 every 3 s (shorter than the down window):
    one scale-up, no scale-down while it lasts."""
    f = Fleet()
    for second in range(120):
        f.tick(16 if (second // 3) % 2 == 0 else 0)
    downs = [d for d in f.decisions if d.reason == "scale_down"]
    assert not downs
    assert f.changes() <= 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), min_size=30, max_size=200))
def test_changes_are_bounded_by_the_cooldown_and_stay_in_bounds(loads: list[int]) -> None:
    """Whatever the load, the count stays within [min, max] and two changes are at
    least the cooldown apart."""
    f = Fleet()
    change_times: list[float] = []
    for load in loads:
        before = f.current
        t = f.now
        d = f.tick(load)
        assert 1 <= d.desired <= 4
        if d.desired != before:
            change_times.append(t)
    gaps = [b - a for a, b in itertools.pairwise(change_times)]
    assert all(g >= SETTINGS.cooldown_s for g in gaps)


def test_a_replica_that_fails_to_start_does_not_run_away() -> None:
    """With every new replica failing to start, the policy asks again only after the
    failure hold (twice the start-up time, at least the cooldown), never every tick."""
    f = Fleet()
    f.failing = True
    f.startup_s = 5.0  # hold 10 s
    f.run(200, 30)
    ups = [d for d in f.decisions if d.desired > 1]
    held = [d for d in f.decisions if d.reason == "hold_start_failed"]
    assert f.current == 1
    assert held
    assert len(ups) <= 30 // 10 + 1


def test_a_lost_measurement_holds_and_restarts_the_windows() -> None:
    """A missing backlog holds the count (never scales down on it) and the down window
    starts over after the gap."""
    f = Fleet(current=4)
    f.run(0, 8)
    d = f.tick(None)
    assert (d.desired, d.reason) == (4, "hold_no_measurement")
    f.run(0, 10)
    assert f.current == 4  # a full window since the gap has not passed yet
    f.run(0, 1)
    assert f.current == 1


def test_held_requests_at_zero_start_one_even_without_a_measurement() -> None:
    """At zero with the store unreadable, held requests still start one replica."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 0}), current=0)
    assert f.tick(None).desired == 0
    d = f.tick(None, waiting=2)
    assert (d.desired, d.reason) == (1, "cold_start")


def test_idle_to_zero_and_a_cold_start() -> None:
    """With min_replicas 0: no load for idle_to_zero_s stops the last replica; a
    waiting request (or any backlog) at zero starts one at once."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 0}))
    f.run(0, 30)
    assert f.current == 1
    d = f.tick(0)
    assert (d.desired, d.reason) == (0, "idle_to_zero")
    f.run(0, 5)
    assert f.current == 0
    assert f.decisions[-1].reason == "steady"
    d = f.tick(0, waiting=1)
    assert (d.desired, d.reason) == (1, "cold_start")


def test_held_requests_count_as_load() -> None:
    """At zero, nine requests held by gateways start ceil(9 / 4) = 3 replicas."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 0}), current=0)
    d = f.tick(0, waiting=9)
    assert (d.desired, d.reason) == (3, "cold_start")


def test_a_cold_start_under_a_burst_starts_what_the_backlog_needs() -> None:
    """At zero, a backlog of 10 starts ceil(10 / 4) = 3 replicas in one decision."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 0}), current=0)
    d = f.tick(10)
    assert (d.desired, d.reason) == (3, "cold_start")


def test_in_flight_sync_requests_count_as_load() -> None:
    """Sync requests in flight count like jobs in the backlog."""
    f = Fleet()
    f.run(0, 3, inflight=12)
    assert f.current == 3


def test_below_min_is_raised_at_once_and_min_zero_never_goes_below_one_by_window() -> None:
    """A count under min_replicas is raised at once; with min 0 the down window stops
    at one replica (only idleness reaches zero)."""
    f = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 2}), current=0)
    d = f.tick(0)
    assert (d.desired, d.reason) == (2, "bounds")
    g = Fleet(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 0}), current=3)
    g.run(1, 40)
    assert g.current == 1


def test_settings_problems() -> None:
    """max_replicas below min_replicas (or 0) is a problem naming the table."""
    assert AutoscaleSettings(min_replicas=3, max_replicas=2).problems("servers.X")
    assert AutoscaleSettings(min_replicas=0, max_replicas=0).problems("servers.X")
    assert not AutoscaleSettings(min_replicas=0, max_replicas=1).problems("servers.X")
