"""``POST /api/v1/autoscale/<id>/wake`` in memory: the gateway's cold-start call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mortred_twisted.config.control import AutoscaleSettings
from mortred_twisted.supervisor.replicas import ReplicaGroup
from mortred_twisted.supervisor.scaler import Scaler

from .test_scaler import FakeMeter
from .test_supervisor_api import AUTH, Harness

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport")

INTERNAL = {"Authorization": "Bearer internal"}


def scaled(h: Harness, timeout_s: float = 5.0) -> Scaler:
    group = ReplicaGroup("A", [h.server], floor=0)
    settings = AutoscaleSettings(min_replicas=0, max_replicas=1, cold_start_timeout_s=timeout_s)
    scaler = Scaler(group, settings, FakeMeter(), h.clock, lambda _i: "http://127.0.0.1:18100")
    h.supervisor.scalers["A"] = scaler
    group.start()
    return scaler


def answered(h: Harness, d: Any, seconds: float) -> list[Any]:
    out: list[Any] = []
    d.addCallback(lambda r: r.content().addCallback(lambda b: out.append((r, b))))
    for _ in range(int(seconds * 10)):
        h.clock.advance(0.1)
        h.flush()
    return out


def test_wake_starts_a_replica_and_answers_once_it_is_ready() -> None:
    """The internal token wakes a scaled-to-zero id: a replica starts, the answer
    (200, its URL, the cold-start time) comes when it is ready."""
    h = Harness()
    scaler = scaled(h)
    d = h.client.request("POST", "http://sup/api/v1/autoscale/A/wake", headers=INTERNAL)
    h.flush()
    assert h.server.state == "starting"
    h.prober.ready["http://a/ready"] = True
    out = answered(h, d, 1.0)
    response, body = out[0]
    doc = json.loads(body)
    assert response.code == 200 and doc["url"] == "http://127.0.0.1:18100"
    assert doc["cold_starts"] == 1 and doc["cold_start_s"] is not None
    assert scaler.waiting == 0
    code, body, _h = h.call("GET", "/api/v1/servers/A", headers=AUTH)
    assert code == 200 and json.loads(body)["autoscale"]["cold_starts"] == 1


def test_wake_past_the_bound_is_503_with_retry_after() -> None:
    """No replica ready within cold_start_timeout_s: 503 with Retry-After."""
    h = Harness()
    scaled(h, timeout_s=2.0)
    d = h.client.request("POST", "http://sup/api/v1/autoscale/A/wake", headers=AUTH)
    out = answered(h, d, 3.0)
    response, body = out[0]
    assert response.code == 503
    assert response.headers.getRawHeaders("retry-after") == ["2"]
    assert json.loads(body)["retry_after_s"] == 2


def test_wake_refusals() -> None:
    """No token: 401; an id that is not autoscaled: 404; an operator's stop: 503."""
    h = Harness()
    assert h.call("POST", "/api/v1/autoscale/A/wake")[0] == 401
    assert h.call("POST", "/api/v1/autoscale/A/wake", headers=INTERNAL)[0] == 404
    scaler = scaled(h)
    scaler.group.stop()
    code, _body, headers = h.call("POST", "/api/v1/autoscale/A/wake", headers=INTERNAL)
    assert code == 503 and headers.getRawHeaders("retry-after")
