"""The gateway's own Prometheus registry (never the global one).

Names: ``mortred_gateway_requests_total{route,status}``,
``mortred_gateway_upstream_latency_ms{route}``,
``mortred_gateway_upstream_errors_total{kind}``,
``mortred_gateway_auth_failures_total{reason}``,
``mortred_gateway_inflight_requests``, ``mortred_gateway_api_keys``,
``mortred_gateway_key_reloads_total{result}``,
``mortred_gateway_cold_start_requests_total{outcome}``,
``mortred_gateway_key_job_submits_total{key,status}`` (per API key name, from the key
file only, at most :data:`MAX_KEY_LABELS` names), and the edge limits
(:mod:`~mortred_twisted.metrics.edge`): ``mortred_gateway_body_bytes_held``, …
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mortred_twisted.metrics.edge import EdgeLimitsCollector
from mortred_twisted.metrics.requests import RequestStats

#: Upstream latency buckets (ms), up to the default 180 s upstream receive timeout.
GATEWAY_MS_BUCKETS = (
    0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 180000,
)  # fmt: skip


class HotPathStats(RequestStats):
    """The gateway's per-request families (the shared :class:`RequestStats`):
    ``mortred_gateway_requests_total{route,status}`` and
    ``mortred_gateway_upstream_latency_ms{route}``, plus the
    ``mortred_gateway_inflight_requests`` gauge read from :attr:`inflight`.

    Thread contract: recording and scrapes run on the reactor thread.
    """

    def __init__(self) -> None:
        super().__init__(
            requests_name="mortred_gateway_requests",
            requests_help="Gateway requests by route and status",
            status_label="status",
            latency_name="mortred_gateway_upstream_latency_ms",
            latency_help="Upstream round trip (ms)",
            buckets=GATEWAY_MS_BUCKETS,
        )
        self.inflight = 0

    def collect(self) -> Iterator[Metric]:
        yield from super().collect()
        yield GaugeMetricFamily(
            "mortred_gateway_inflight_requests", "Requests being forwarded", value=self.inflight
        )


#: Distinct key names a per-key family labels; later names count as ``other``.
MAX_KEY_LABELS = 100


class KeySubmitStats:
    """``mortred_gateway_key_job_submits_total{key,status}``: job submits per API key
    and answer status (202 admitted, 429 the caller's quota or the model's queue,
    422 …). The key is the name of the key the gateway authenticated (never a
    header value), and at most :data:`MAX_KEY_LABELS` names get their own label.

    Thread contract: reactor thread (counting and scrapes)."""

    def __init__(self, max_keys: int = MAX_KEY_LABELS) -> None:
        self.max_keys = max_keys
        self._counts: dict[tuple[str, str], int] = {}
        self._names: set[str] = set()

    def count(self, key: str, status: int) -> None:
        if key not in self._names:
            if len(self._names) >= self.max_keys:
                key = "other"
            else:
                self._names.add(key)
        label = (key, str(status))
        self._counts[label] = self._counts.get(label, 0) + 1

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "mortred_gateway_key_job_submits", "Job submits per API key and status",
            labels=["key", "status"],
        )  # fmt: skip
        for (key, status), value in sorted(self._counts.items()):
            family.add_metric([key, status], value)
        yield family


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
        self.key_submits = KeySubmitStats()
        r.register(self.key_submits)
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

    def watch_server(self, server: object) -> None:
        """Export the server's edge limits (body budget, per-address cap, write
        pauses) as ``mortred_gateway_*`` families."""
        self.registry.register(EdgeLimitsCollector("mortred_gateway", server))

    def watch_cold_start(self, cold: object) -> None:
        """Export a :class:`~mortred_twisted.gateway.cold_start.ColdStart`'s counts as
        ``mortred_gateway_cold_start_requests_total{outcome}``: ``held`` (until a
        replica was ready), ``refused`` (503 beyond the bounds), ``admitted`` (jobs
        admitted here at zero replicas, http/gateway_admission.py)."""
        self.registry.register(_ColdStartCollector(cold))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ColdStartCollector:
    """Reads the cold-start counters at scrape time (reactor thread)."""

    def __init__(self, cold: object) -> None:
        self._cold = cold

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "mortred_gateway_cold_start_requests",
            "Requests for an autoscaled id with no replica up, by outcome",
            labels=["outcome"],
        )
        for outcome in ("held", "refused", "admitted"):
            family.add_metric([outcome], getattr(self._cold, outcome, 0))
        yield family
