"""The supervisor's Prometheus registry: children's state read at scrape time.

``mortred_supervisor_state{server}`` (0 stopped, 1 starting, 2 running, 3 backoff,
4 failed, 5 start_failed), ``mortred_supervisor_ready{server}`` (0/1) and
``mortred_supervisor_restarts_total{server}``; per autoscaled model id (the figures
an external autoscaler scales on, docs/operations.md § 7):
``mortred_autoscale_backlog{model}`` (pending + running jobs in the store),
``mortred_autoscale_inflight{model}`` (sync requests in flight),
``mortred_autoscale_desired_replicas{model}``, ``mortred_autoscale_current_replicas
{model}``, ``mortred_autoscale_ready_replicas{model}``,
``mortred_autoscale_reason{model,reason}`` (1 for the last decision's reason),
``mortred_autoscale_decisions_total{model,reason}``, ``mortred_autoscale_waiting
{model}`` (requests held for a cold start), ``mortred_autoscale_startup_seconds
{model}`` and ``mortred_autoscale_cold_start_seconds{model}`` (the last measured),
``mortred_autoscale_cold_starts_total{model}``. A figure not known yet (no
measurement) is left out. A collector reads the live
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
            "Child state: 0 stopped, 1 starting, 2 running, 3 backoff, 4 failed, 5 start_failed",
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
        yield from self._autoscale()

    def _autoscale(self) -> Iterator[Any]:
        def gauge(name: str, text: str, labels: tuple[str, ...] = ("model",)) -> Any:
            return GaugeMetricFamily(f"mortred_autoscale_{name}", text, labels=list(labels))

        backlog = gauge("backlog", "Pending + running jobs of the model in the job store")
        inflight = gauge("inflight", "Synchronous requests in flight on its replicas")
        desired = gauge("desired_replicas", "Replicas the autoscaler wants")
        current = gauge("current_replicas", "Replicas up or starting")
        ready = gauge("ready_replicas", "Replicas ready")
        waiting = gauge("waiting", "Requests held by gateways for a cold start")
        startup = gauge("startup_seconds", "Last measured replica start-up time")
        cold = gauge("cold_start_seconds", "Last cold start: first held request to ready")
        reason = gauge("reason", "1 for the last decision's reason", ("model", "reason"))
        decisions = CounterMetricFamily(
            "mortred_autoscale_decisions", "Autoscaler decisions", labels=["model", "reason"]
        )
        colds = CounterMetricFamily(
            "mortred_autoscale_cold_starts", "Cold starts completed", labels=["model"]
        )
        for model, scaler in self.supervisor.scalers.items():
            doc = scaler.status()
            for family, key in (
                (backlog, "backlog"),
                (inflight, "inflight"),
                (desired, "desired"),
                (current, "current"),
                (ready, "ready"),
                (waiting, "waiting"),
                (startup, "startup_s"),
                (cold, "cold_start_s"),
            ):
                if doc[key] is not None:
                    family.add_metric([model], doc[key])
            if doc["reason"] is not None:
                reason.add_metric([model, doc["reason"]], 1)
            for why, n in sorted(scaler.decisions.items()):
                decisions.add_metric([model, why], n)
            colds.add_metric([model], doc["cold_starts"])
        yield from (backlog, inflight, desired, current, ready, waiting, startup, cold)
        yield from (reason, decisions, colds)


def supervisor_registry(supervisor: Supervisor) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SupervisorCollector(supervisor))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
