"""The model server's metrics render as valid Prometheus text with the right values."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mortred_twisted.metrics.server import ServerMetrics


def families(metrics: ServerMetrics) -> dict:
    text = metrics.render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_http_request_stats_render_counts_and_cumulative_buckets() -> None:
    """Requests are counted per route and code; durations land in cumulative buckets."""
    metrics = ServerMetrics()
    metrics.http.record("jobs_status", 200, 0.3)
    metrics.http.record("jobs_status", 200, 7.0)
    metrics.http.record("jobs_status", 404, 0.2)
    fams = families(metrics)
    counts = {
        (s.labels["route"], s.labels["code"]): s.value
        for s in fams["mortred_http_requests"].samples
        if s.name.endswith("_total")
    }
    assert counts == {("jobs_status", "200"): 2, ("jobs_status", "404"): 1}
    samples = fams["mortred_http_request_duration_ms"].samples
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    assert buckets["0.25"] == 1 and buckets["0.5"] == 2 and buckets["5.0"] == 2
    assert buckets["10.0"] == 3 and buckets["+Inf"] == 3
    total = next(s.value for s in samples if s.name.endswith("_sum"))
    count = next(s.value for s in samples if s.name.endswith("_count"))
    assert abs(total - 7.5) < 1e-9 and count == 3


def test_job_state_counters_start_at_zero() -> None:
    """Every job state is exported from the start, so rate() works from the first job."""
    fams = families(ServerMetrics())
    states = {s.labels["state"]: s.value for s in fams["mortred_async_jobs"].samples
              if s.name.endswith("_total")}  # fmt: skip
    assert states == dict.fromkeys(
        ("submitted", "running", "done", "failed", "timeout", "cancelled"), 0
    )


def test_gateway_and_model_server_share_one_request_collector() -> None:
    """The gateway's per-request families come from the same collector as the model
    server's: counts without a latency, latencies in cumulative buckets, in-flight."""
    from mortred_twisted.gateway.metrics import GatewayMetrics
    from mortred_twisted.metrics.requests import RequestStats

    gateway = GatewayMetrics()
    assert isinstance(gateway.hot, RequestStats) and isinstance(ServerMetrics().http, RequestStats)
    gateway.hot.count("refused", "413")  # refused before forwarding: no latency
    gateway.hot.record("jobs_status", "200", 0.7)
    gateway.hot.inflight = 2
    fams = {f.name: f for f in text_string_to_metric_families(gateway.render().decode())}
    counts = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in fams["mortred_gateway_requests"].samples
        if s.name.endswith("_total")
    }
    assert counts == {("refused", "413"): 1, ("jobs_status", "200"): 1}
    assert gateway.hot.requests("refused", "413") == 1
    latency = fams["mortred_gateway_upstream_latency_ms"].samples
    routes = {s.labels["route"] for s in latency}
    assert routes == {"jobs_status"}
    buckets = {s.labels["le"]: s.value for s in latency if s.name.endswith("_bucket")}
    assert buckets["0.5"] == 0 and buckets["1.0"] == 1 and buckets["180000.0"] == 1
    assert fams["mortred_gateway_inflight_requests"].samples[0].value == 2
