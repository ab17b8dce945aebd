"""The autoscaler loop on task.Clock: a fake store meter, fake children, the real
policy, group and metrics."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock

from mortred_twisted.config.control import AutoscaleSettings
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.metrics import render, supervisor_registry
from mortred_twisted.supervisor.monitor import ManagedServer, Supervisor, Timing
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.process import ProcessSpec
from mortred_twisted.supervisor.replicas import ReplicaGroup
from mortred_twisted.supervisor.scaler import Reading, Scaler

from .fakes import FakeProber, FakeSpawner

SETTINGS = AutoscaleSettings(
    min_replicas=0,
    max_replicas=3,
    target_backlog_per_replica=4,
    scale_up_window_s=1,
    scale_down_window_s=5,
    idle_to_zero_s=10,
    cooldown_s=1,
    interval_s=1,
    cold_start_timeout_s=20,
)


class FakeMeter:
    """``backlog`` is what the store holds (None: unreadable); ``busy`` per URL."""

    def __init__(self) -> None:
        self.backlog_value: int | None = 0
        self.running = 0
        self.busy: dict[str, int] = {}

    def backlog(self) -> defer.Deferred[Reading]:
        if self.backlog_value is None:
            return defer.succeed(Reading(None, None))
        return defer.succeed(Reading(self.backlog_value, self.running))

    def busy_workers(self, base_url: str) -> defer.Deferred[int | None]:
        return defer.succeed(self.busy.get(base_url, 0))


class Rig:
    def __init__(self, settings: AutoscaleSettings = SETTINGS) -> None:
        self.clock = Clock()
        self.spawner = FakeSpawner()
        self.prober = FakeProber()
        self.meter = FakeMeter()
        members = [
            ManagedServer(
                f"M@{i + 1}",
                kind="model",
                spec=ProcessSpec((f"M@{i + 1}",)),
                probe_url=f"http://m{i}/ready",
                tracker=RestartTracker("on-failure"),
                clock=self.clock,
                spawner=self.spawner,
                prober=self.prober,
                log_buffer=LogBuffer(),
                timing=Timing(probe_interval=0.5, ready_timeout=30, grace=3),
            )
            for i in range(settings.max_replicas)
        ]
        self.group = ReplicaGroup("M", members, floor=settings.min_replicas)
        self.scaler = Scaler(self.group, settings, self.meter, self.clock, lambda i: f"http://m{i}")
        self.supervisor = Supervisor([self.group])
        self.supervisor.scalers["M"] = self.scaler
        self.group.start()
        self.scaler.start()

    def boot(self, i: int) -> None:
        """Replica ``i`` answers its ready probe from now on."""
        self.prober.ready[f"http://m{i}/ready"] = True

    def run(self, seconds: float) -> None:
        steps = int(seconds / 0.25)
        for _ in range(steps):
            self.clock.advance(0.25)

    def up(self) -> int:
        return len(self.group.up())


def test_backlog_scales_up_to_max_and_back_to_zero() -> None:
    """A backlog of 40 takes 0 -> 3 replicas; when it is gone, the down window takes it
    to 1 and idleness to 0; every decision is in status and metrics."""
    rig = Rig()
    for i in range(3):
        rig.boot(i)
    rig.meter.backlog_value = 40
    rig.run(1.0)
    assert rig.up() == 3  # a cold start starts what the backlog needs at once
    assert rig.scaler.status()["reason"] == "cold_start"
    rig.meter.backlog_value = 0
    rig.run(7)
    assert rig.up() == 1
    rig.run(6)
    assert rig.up() == 0
    status = rig.supervisor.status()[0]["autoscale"]
    assert status["reason"] in ("idle_to_zero", "steady")
    assert status["desired"] == 0
    text = render(supervisor_registry(rig.supervisor)).decode()
    assert 'mortred_autoscale_desired_replicas{model="M"} 0.0' in text
    assert 'mortred_autoscale_backlog{model="M"} 0.0' in text
    assert 'mortred_autoscale_decisions_total{model="M",reason="scale_down"}' in text


def test_a_wake_starts_one_and_fires_with_its_url_and_the_cold_start_time() -> None:
    """At zero, a held request (wake) starts a replica; it fires with the ready
    replica's URL, and the cold-start time is the wake-to-ready time."""
    rig = Rig()
    woke: list[Any] = []
    rig.scaler.wake().addCallback(woke.append)
    assert rig.up() == 1 and rig.scaler.waiting == 1
    rig.run(2.0)
    assert woke == []
    rig.boot(0)
    rig.run(1.0)
    assert woke == ["http://m0"]
    assert rig.scaler.cold_starts == 1
    assert 2.0 <= rig.scaler.cold_start_s <= 3.0  # type: ignore[operator]
    assert rig.group.replicas[0].startup_s == rig.scaler.startup_s()


def test_a_wake_that_times_out_fires_none_and_retry_after_is_the_startup_time() -> None:
    """A replica that never gets ready: the wake fires None after the bound; the
    Retry-After offered is the cold-start bound until a start-up time is measured."""
    rig = Rig()
    woke: list[Any] = []
    rig.scaler.wake().addCallback(woke.append)
    rig.run(21)
    assert woke == [None]
    assert rig.scaler.retry_after_s() == 20


def test_an_operator_stop_is_left_alone() -> None:
    """After an operator's stop the scaler starts nothing, whatever the backlog, but
    still measures and exports it (what an external autoscaler reads)."""
    rig = Rig()
    rig.group.stop()
    rig.meter.backlog_value = 100
    rig.run(5)
    assert rig.up() == 0
    assert not rig.scaler.status()["active"]
    assert rig.scaler.status()["backlog"] == 100
    text = render(supervisor_registry(rig.supervisor)).decode()
    assert 'mortred_autoscale_backlog{model="M"} 100.0' in text


def test_a_lost_backlog_holds_the_count() -> None:
    """The store unreadable: the count holds (no scale-down, no idle to zero)."""
    rig = Rig()
    for i in range(3):
        rig.boot(i)
    rig.meter.backlog_value = 40
    rig.run(1.0)
    rig.meter.backlog_value = None
    rig.run(30)
    assert rig.up() == 3
    assert rig.scaler.status()["reason"] == "hold_no_measurement"


def test_busy_workers_beyond_running_jobs_count_as_sync_load() -> None:
    """Busy workers not running a job are sync requests in flight: they scale too."""
    rig = Rig(AutoscaleSettings(**{**SETTINGS.__dict__, "min_replicas": 1}))
    rig.boot(0)
    rig.run(1.0)
    rig.meter.busy["http://m0"] = 9
    rig.meter.running = 1
    rig.run(3.0)
    assert rig.scaler.inflight == 8
    assert rig.up() == 2


def test_stopping_prefers_not_ready_then_the_highest_numbered() -> None:
    """Scaling down stops a replica that is not ready first, then the newest."""
    rig = Rig()
    rig.boot(0)
    rig.boot(2)
    rig.meter.backlog_value = 40
    rig.run(2.0)
    assert rig.up() == 3
    assert [r.ready for r in rig.group.replicas] == [True, False, True]
    rig.group.scale_to(2)
    assert [r.id for r in rig.group.up()] == ["M@1", "M@3"]
    rig.group.scale_to(1)
    assert [r.id for r in rig.group.up()] == ["M@1"]
