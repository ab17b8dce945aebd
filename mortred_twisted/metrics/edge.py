"""Prometheus families of an HTTP server's edge limits (read at scrape time).

``<prefix>_body_bytes_held`` (request bodies held against the body budget),
``<prefix>_body_budget_bytes`` (the budget; 0 = none),
``<prefix>_body_budget_refusals_total`` (heads answered 503 for lack of budget),
``<prefix>_address_refusals_total`` (connections closed by the per-address cap),
``<prefix>_write_pauses_total`` (times a connection stopped reading because its
client did not read its answers), ``<prefix>_write_timeouts_total`` (connections
aborted by the write deadline: their client read nothing). The server object is
any with those attributes (:class:`~mortred_twisted.http11.server.HTTPServerFactory`).

Thread contract: scrapes run on the reactor thread, as the server's updates do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class EdgeLimitsCollector:
    """Reads the edge counters of ``server`` at every scrape (never a label taken
    from a request: fixed cardinality)."""

    def __init__(self, prefix: str, server: Any) -> None:
        self._prefix = prefix
        self._server = server

    def collect(self) -> Iterator[Metric]:
        p, s = self._prefix, self._server
        yield GaugeMetricFamily(
            f"{p}_body_bytes_held", "Request body bytes held at once", value=s.body_bytes_held
        )
        yield GaugeMetricFamily(
            f"{p}_body_budget_bytes", "Body budget (0: none)", value=s.body_budget_bytes
        )
        yield CounterMetricFamily(
            f"{p}_body_budget_refusals",
            "Requests refused from the head: no body budget left",
            value=s.budget_refusals,
        )
        yield CounterMetricFamily(
            f"{p}_address_refusals",
            "Connections refused: too many from one client address",
            value=s.address_refusals,
        )
        yield CounterMetricFamily(
            f"{p}_write_pauses",
            "Times a connection stopped reading while its client did not read",
            value=s.write_pauses,
        )
        yield CounterMetricFamily(
            f"{p}_write_timeouts",
            "Connections aborted: their client read none of their answers in time",
            value=s.write_timeouts,
        )
