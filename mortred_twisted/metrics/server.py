"""Prometheus metrics of one model-server process (its own registry, never the global).

Names are kept from the C++ server so existing dashboards keep working. Rendering
happens on the reactor thread with ``generate_latest(registry)`` (the
``prometheus_client.twisted`` resource would run on the global thread pool and
install the default reactor at import).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mortred_twisted.metrics.requests import MS_BUCKETS, RequestStats

JOB_STATES = ("submitted", "running", "done", "failed", "timeout", "cancelled")


class Children:
    """``children[value]``: the child of a one-label metric for ``value``, made on
    first use (so the exposition only shows values that occurred) and kept:
    prometheus-client's ``labels()`` validates and takes a lock on every call, and a
    job called it five times. Any thread; racing first uses get the same child."""

    def __init__(self, metric: Any, label: str) -> None:
        self._metric = metric
        self._label = label
        self._made: dict[str, Any] = {}

    def __getitem__(self, value: str) -> Any:
        child = self._made.get(value)
        if child is None:
            child = self._made[value] = self._metric.labels(**{self._label: value})
        return child


class ServerMetrics:
    """The metric families of a model server, bound to one registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.async_jobs = Counter(
            "mortred_async_jobs",
            "Async jobs by lifecycle event (submitted, running, done, failed, timeout, cancelled).",
            ["state"],
            registry=r,
        )
        #: pre-bound children (a labels() lookup per event costs on the reactor)
        self.job_events = {state: self.async_jobs.labels(state=state) for state in JOB_STATES}
        self.async_rejected = Counter(
            "mortred_async_rejected",
            "Async submissions refused because the queue was full (429).",
            registry=r,
        )
        self.async_job_duration = Histogram(
            "mortred_async_job_duration_ms",
            "Async job time from admission to terminal state, in ms.",
            ["state"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.job_duration_by_state = Children(self.async_job_duration, "state")
        self.async_queue_depth = Gauge(
            "mortred_async_queue_depth", "Admitted async jobs not yet terminal.", registry=r
        )
        #: ``mortred_http_requests_total{route,code}`` and
        #: ``mortred_http_request_duration_ms{route}`` (time to response finished).
        self.http = RequestStats(
            requests_name="mortred_http_requests",
            requests_help="HTTP requests by route and status code.",
            status_label="code",
            latency_name="mortred_http_request_duration_ms",
            latency_help="Time from request received to response finished, in ms.",
        )
        r.register(self.http)
        self.inference_duration = Histogram(
            "mortred_inference_duration_ms",
            "Model run time on a worker thread, in ms.",
            ["path"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.queue_wait_duration = Histogram(
            "mortred_queue_wait_duration_ms",
            "Time spent waiting for a free worker, in ms.",
            ["path"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.inference_by_path = Children(self.inference_duration, "path")
        self.queue_wait_by_path = Children(self.queue_wait_duration, "path")
        self.queue_rejected = Counter(
            "mortred_queue_rejected",
            "Sync requests refused by backpressure (max_queue_depth, 429).",
            registry=r,
        )
        self.workers_available = Gauge(
            "mortred_workers_available", "Model workers free right now.", registry=r
        )
        self.workers_busy = Gauge(
            "mortred_workers_busy", "Model workers running a request or job.", registry=r
        )
        self.ready = Gauge("mortred_ready", "1 when the server accepts work, else 0.", registry=r)
        self.async_waiters = Gauge(
            "mortred_async_waiters", "Long-polls (/jobs/{id}/wait) parked right now.", registry=r
        )
        self.wait_wakeups = Counter(
            "mortred_async_wait_wakeups",
            "Long-polls answered, by reason (terminal, budget, immediate).",
            ["reason"],
            registry=r,
        )
        self.wakeups_by_reason = Children(self.wait_wakeups, "reason")
        self.webhook_deliveries = Counter(
            "mortred_webhook_deliveries",
            "Webhook messages by event (start, progress, completed) and final outcome "
            "(delivered, failed, dropped).",
            ["event", "outcome"],
            registry=r,
        )
        self.event_streams = Gauge(
            "mortred_job_event_streams", "Open /jobs/{id}/events streams.", registry=r
        )

    def bind_gauges(
        self,
        *,
        queue_depth: Callable[[], float],
        workers_available: Callable[[], float],
        workers_busy: Callable[[], float],
        ready: Callable[[], float],
        waiters: Callable[[], float],
    ) -> None:
        """Make gauges read live values at scrape time (no bookkeeping to drift)."""
        self.async_queue_depth.set_function(queue_depth)
        self.workers_available.set_function(workers_available)
        self.workers_busy.set_function(workers_busy)
        self.ready.set_function(ready)
        self.async_waiters.set_function(waiters)

    def render(self) -> bytes:
        return generate_latest(self.registry)
