"""The gateway's own Prometheus registry (never the global one).

Names: ``mortred_gateway_requests_total{route,status}``,
``mortred_gateway_upstream_latency_ms{route}``,
``mortred_gateway_upstream_errors_total{kind}``,
``mortred_gateway_auth_failures_total{reason}``,
``mortred_gateway_inflight_requests``, ``mortred_gateway_api_keys``,
``mortred_gateway_key_reloads_total{result}``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_MS_BUCKETS = (
    0.5,
    1,
    2,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
    30000,
    60000,
    180000,
)


class HotPathStats(Collector):
    """The per-request families, kept as plain ints/floats and folded at scrape time.

    ``mortred_gateway_requests_total{route,status}``,
    ``mortred_gateway_upstream_latency_ms{route}``, ``mortred_gateway_inflight_requests``.
    Recording is a dict update (and a bisect) instead of prometheus-client's locked
    children, which cost several µs each on every proxied request.
    Thread contract: recording and scrapes run on the reactor thread.
    """

    def __init__(self, buckets: tuple[float, ...] = _MS_BUCKETS) -> None:
        self._bounds = list(buckets)
        self.counts: dict[tuple[str, str], int] = {}
        self._latency: dict[str, tuple[list[int], list[float]]] = {}
        self.inflight = 0

    def count(self, route: str, status: str) -> None:
        key = (route, status)
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1

    def observe_upstream(self, route: str, ms: float) -> None:
        entry = self._latency.get(route)
        if entry is None:
            entry = self._latency[route] = ([0] * (len(self._bounds) + 1), [0.0])
        entry[0][bisect_left(self._bounds, ms)] += 1
        entry[1][0] += ms

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "mortred_gateway_requests", "Gateway requests by route and status",
            labels=["route", "status"],
        )  # fmt: skip
        for (route, status), n in sorted(self.counts.items()):
            requests.add_metric([route, status], n)
        yield requests
        latency = HistogramMetricFamily(
            "mortred_gateway_upstream_latency_ms", "Upstream round trip (ms)", labels=["route"]
        )
        for route, (counts, total) in sorted(self._latency.items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*self._bounds, float("inf")], counts, strict=True):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            latency.add_metric([route], buckets, sum_value=total[0])
        yield latency
        yield GaugeMetricFamily(
            "mortred_gateway_inflight_requests", "Requests being forwarded", value=self.inflight
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


class GatewayMetrics:
    """All gateway metrics on one registry; updated on the reactor thread.

    The per-request families live in :attr:`hot` (:class:`HotPathStats`); the rare
    events (auth failures, upstream errors, key reloads) are prometheus-client
    counters.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.hot = HotPathStats()
        r.register(self.hot)
        self.upstream_errors = Counter(
            "mortred_gateway_upstream_errors",
            "Upstream failures by kind",
            ["kind"],
            registry=r,
        )
        self.auth_failures = Counter(
            "mortred_gateway_auth_failures",
            "Rejected credentials by reason",
            ["reason"],
            registry=r,
        )
        self.api_keys = Gauge("mortred_gateway_api_keys", "Loaded API keys", registry=r)
        #: Read at scrape time; the server binds it (``set_function``) to its count.
        self.open_connections = Gauge(
            "mortred_gateway_open_connections", "Open client connections", registry=r
        )
        self.key_reloads = Counter(
            "mortred_gateway_key_reloads", "API key reloads", ["result"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
