"""The gateway's own Prometheus registry (never the global one).

Names: ``mortred_gateway_requests_total{route,status}``,
``mortred_gateway_request_duration_ms{route}``,
``mortred_gateway_upstream_latency_ms{route}``,
``mortred_gateway_upstream_errors_total{kind}``,
``mortred_gateway_auth_failures_total{reason}``,
``mortred_gateway_inflight_requests``, ``mortred_gateway_api_keys``,
``mortred_gateway_key_reloads_total{result}``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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


class GatewayMetrics:
    """All gateway metrics on one registry; updated on the reactor thread."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mortred_gateway_requests",
            "Gateway requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "mortred_gateway_request_duration_ms",
            "Gateway request duration (ms)",
            ["route"],
            buckets=_MS_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "mortred_gateway_upstream_latency_ms",
            "Upstream round trip (ms)",
            ["route"],
            buckets=_MS_BUCKETS,
            registry=r,
        )
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
        self.inflight = Gauge(
            "mortred_gateway_inflight_requests", "Requests being forwarded", registry=r
        )
        self.api_keys = Gauge("mortred_gateway_api_keys", "Loaded API keys", registry=r)
        self.key_reloads = Counter(
            "mortred_gateway_key_reloads", "API key reloads", ["result"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
