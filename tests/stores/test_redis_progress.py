"""ProgressWriter: progress writes coalesced per job on a task.Clock (≤ 5 a second
plus the last step; one reactor hop per write, not per step)."""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet.task import Clock

from mortred_twisted.stores.redis_progress import ProgressWriter


class HopCountingClock(Clock):
    """A Clock whose callFromThread runs at once and counts the hops."""

    def __init__(self) -> None:
        super().__init__()
        self.hops = 0

    def callFromThread(self, fn: Any, *args: Any) -> None:
        self.hops += 1
        fn(*args)


def writer() -> tuple[HopCountingClock, ProgressWriter, list[tuple[float, str, str]]]:
    clock = HopCountingClock()
    writes: list[tuple[float, str, str]] = []
    return clock, ProgressWriter(clock, lambda j, t: writes.append((clock.seconds(), j, t))), writes


def test_a_burst_of_steps_is_one_write_now_and_one_with_the_latest_step_later() -> None:
    """The first step is written at once; the 98 that follow within 0.2 s become one
    write of the latest step 0.2 s after the first; two hops in all."""
    clock, progress, writes = writer()
    for step in range(1, 100):
        progress.report("j", step, 1000)
    assert writes == [(0.0, "j", "1/1000")]
    clock.advance(0.2)
    assert writes[1:] == [(0.2, "j", "99/1000")] and clock.hops == 2


def test_the_last_step_is_written_at_once() -> None:
    """A run's last step does not wait for the interval (a finished bar shows full)."""
    clock, progress, writes = writer()
    progress.report("j", 1, 3)
    progress.report("j", 2, 3)
    progress.report("j", 3, 3)
    assert [t for _at, _j, t in writes] == ["1/3", "3/3"]
    clock.advance(1)
    assert len(writes) == 2  # the scheduled write was folded into the last one


def test_writes_per_job_never_exceed_five_a_second() -> None:
    """A model stepping every 10 ms for 2 s: at most 11 writes (5/s plus the first)."""
    clock, progress, writes = writer()
    for step in range(1, 200):
        progress.report("j", step, 1000)
        clock.advance(0.01)
    assert 9 <= len(writes) <= 11
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(writes)]
    assert min(gaps) >= 0.2 - 1e-9


def test_a_forgotten_job_writes_nothing_more() -> None:
    """A job that ended (or was handed back) drops its pending step."""
    clock, progress, writes = writer()
    progress.report("j", 1, 10)
    progress.report("j", 2, 10)
    progress.forget("j")
    clock.advance(1)
    assert [t for _at, _j, t in writes] == ["1/10"]
