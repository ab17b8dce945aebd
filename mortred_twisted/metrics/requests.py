"""Per-request Prometheus families kept as plain numbers: one collector for every server.

Every request a model server or the gateway answers is counted by route and status,
and a per-route latency lands in a histogram. prometheus-client's labelled children
take a lock and cost several µs each; on the hot path that is a visible share of a
poll. :class:`RequestStats` records with a dict update and a bisect instead, and
builds the metric families only when scraped.

Thread contract: recording and scrapes run on the same thread (the reactor's); the
collector takes no lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: Buckets in milliseconds: sub-millisecond HTTP work up to multi-minute jobs.
MS_BUCKETS = (
    0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
    10000, 30000, 60000, 120000, 300000, 600000,
)  # fmt: skip


class RequestStats(Collector):
    """A counter ``<requests_name>_total{route,<status_label>}`` and a histogram
    ``<latency_name>{route}`` (``_bucket``/``_sum``/``_count``).

    ``status`` values are used as given (an ``int`` code or a ``str``) and become
    label text at scrape time; one instance should use one kind. The counter and the
    histogram are independent: a request may be counted without a latency (the
    gateway counts refusals it never forwards) or recorded with both (:meth:`record`).
    """

    def __init__(
        self,
        *,
        requests_name: str,
        requests_help: str,
        status_label: str,
        latency_name: str,
        latency_help: str,
        buckets: tuple[float, ...] = MS_BUCKETS,
    ) -> None:
        self._requests = (requests_name, requests_help, status_label)
        self._latency_meta = (latency_name, latency_help)
        self._bounds = list(buckets)
        self._counts: dict[tuple[str, int | str], int] = {}
        # route -> ([per-bucket counts, last = +Inf], [sum])
        self._latency: dict[str, tuple[list[int], list[float]]] = {}

    def count(self, route: str, status: int | str) -> None:
        """Count one answered request."""
        key = (route, status)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def observe(self, route: str, ms: float) -> None:
        """Add one latency, in milliseconds, to ``route``'s histogram."""
        entry = self._latency.get(route)
        if entry is None:
            entry = self._latency[route] = ([0] * (len(self._bounds) + 1), [0.0])
        entry[0][bisect_left(self._bounds, ms)] += 1
        entry[1][0] += ms

    def record(self, route: str, status: int | str, ms: float) -> None:
        """:meth:`count` and :meth:`observe` in one call."""
        self.count(route, status)
        self.observe(route, ms)

    def requests(self, route: str, status: int | str) -> int:
        """How many requests were counted for ``route`` and ``status``."""
        return self._counts.get((route, status), 0)

    def collect(self) -> Iterator[Metric]:
        name, help_text, status_label = self._requests
        requests = CounterMetricFamily(name, help_text, labels=["route", status_label])
        for (route, status), n in sorted(self._counts.items()):
            requests.add_metric([route, str(status)], n)
        yield requests
        latency = HistogramMetricFamily(*self._latency_meta, labels=["route"])
        for route, (counts, total) in sorted(self._latency.items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*self._bounds, float("inf")], counts, strict=True):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            latency.add_metric([route], buckets, sum_value=total[0])
        yield latency

    def describe(self) -> Iterator[Metric]:
        return iter(())
