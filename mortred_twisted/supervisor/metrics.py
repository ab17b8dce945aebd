"""The supervisor's Prometheus registry: children's state read at scrape time.

``mortred_supervisor_state{server}`` (0 stopped, 1 starting, 2 running, 3 backoff,
4 failed), ``mortred_supervisor_ready{server}`` (0/1) and
``mortred_supervisor_restarts_total{server}``. A collector reads the live
:class:`~mortred_twisted.supervisor.monitor.Supervisor` on each scrape, so nothing
has to be kept in sync. Scrapes run on the reactor thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mortred_twisted.supervisor.monitor import STATE_VALUE, Supervisor


class SupervisorCollector(Collector):
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Any]:
        state = GaugeMetricFamily(
            "mortred_supervisor_state",
            "Child state: 0 stopped, 1 starting, 2 running, 3 backoff, 4 failed",
            labels=["server"],
        )
        ready = GaugeMetricFamily(
            "mortred_supervisor_ready", "Child readiness probe (1 ready)", labels=["server"]
        )
        restarts = CounterMetricFamily(
            "mortred_supervisor_restarts", "Child restarts", labels=["server"]
        )
        for s in self.supervisor.all():
            state.add_metric([s.id], STATE_VALUE[s.state])
            ready.add_metric([s.id], 1 if s.ready else 0)
            restarts.add_metric([s.id], s.restart_count)
        yield state
        yield ready
        yield restarts


def supervisor_registry(supervisor: Supervisor) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SupervisorCollector(supervisor))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
