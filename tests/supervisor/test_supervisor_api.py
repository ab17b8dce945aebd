"""The supervisor REST API in memory: auth, status, actions, logs, metrics, UI, proxy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet.task import Clock

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.gateway.upstream import UpstreamClient
from mortred_twisted.http.supervisor_api import SupervisorApi
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.metrics import supervisor_registry
from mortred_twisted.supervisor.monitor import ManagedServer, Supervisor, Timing
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.process import ProcessSpec

from ..gateway.fakes import FakeModel
from .fakes import FakeProber, FakeSpawner

# The in-memory transport of RequestTraversalAgent has no abortConnection.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport")

AUTH = {"Authorization": "Bearer mgmt"}


class Harness:
    def __init__(self) -> None:
        self.clock = Clock()
        self.spawner = FakeSpawner()
        self.prober = FakeProber()
        entry = CatalogEntry(
            "A", "fake", "127.0.0.1", 18100, "/mortred/fake/infer", True, 16, "conf/server/a.toml"
        )
        self.catalog = Catalog([entry])
        self.server = ManagedServer(
            "A",
            kind="model",
            spec=ProcessSpec(("A",)),
            probe_url="http://a/ready",
            tracker=RestartTracker(),
            clock=self.clock,
            spawner=self.spawner,
            prober=self.prober,
            log_buffer=LogBuffer(),
            timing=Timing(),
            category="fake",
        )
        self.supervisor = Supervisor([self.server])
        self.model = FakeModel()
        self.upstream = RequestTraversalAgent(self.model.resource())
        api = SupervisorApi(
            supervisor=self.supervisor,
            catalog=self.catalog,
            api_token="mgmt",
            registry=supervisor_registry(self.supervisor),
            proxy=UpstreamClient(self.upstream, self.clock, recv_timeout_s=5),
            internal_token="internal",
        )
        self.client = StubTreq(api.resource())

    def call(self, method: str, path: str, **kw: Any) -> tuple[int, bytes, Any]:
        d = self.client.request(method, "http://sup" + path, **kw)
        for _ in range(3):
            self.upstream.flush()
            self.client.flush()
        out: list[Any] = []
        d.addCallback(lambda r: r.content().addCallback(lambda b: out.append((r, b))))
        for _ in range(3):
            self.upstream.flush()
            self.client.flush()
        response, body = out[0]
        return response.code, body, response.headers


def test_health_public_rest_needs_token() -> None:
    """/api/v1/health is public; status without the token is 401 with WWW-Authenticate."""
    h = Harness()
    assert h.call("GET", "/api/v1/health")[0] == 200
    code, _, headers = h.call("GET", "/api/v1/status")
    assert code == 401 and headers.getRawHeaders("www-authenticate")
    assert h.call("GET", "/api/v1/status", headers={"Authorization": "Bearer no"})[0] == 401


def test_catalog_and_status() -> None:
    """Catalog lists entries; status has the documented fields per server."""
    h = Harness()
    code, body, _ = h.call("GET", "/api/v1/catalog", headers=AUTH)
    assert code == 200 and json.loads(body)["servers"][0]["id"] == "A"
    code, body, _ = h.call("GET", "/api/v1/status", headers=AUTH)
    st = json.loads(body)["servers"][0]
    assert set(st) >= {
        "id",
        "state",
        "ready",
        "pid",
        "restart_count",
        "last_exit",
        "started_at",
        "error",
    }
    assert st["state"] == "stopped"


def test_start_stop_actions() -> None:
    """POST start answers 202 with state starting; stop brings it back to stopped."""
    h = Harness()
    code, body, _ = h.call("POST", "/api/v1/servers/A/start", headers=AUTH)
    assert code == 202 and json.loads(body)["state"] == "starting"
    code, body, _ = h.call("POST", "/api/v1/servers/A/stop", headers=AUTH)
    assert code == 202 and h.server.state == "stopped"
    assert h.call("POST", "/api/v1/servers/NOPE/start", headers=AUTH)[0] == 404
    assert h.call("POST", "/api/v1/servers/A/explode", headers=AUTH)[0] == 404


def test_logs_paging() -> None:
    """Logs return lines with offsets; continuing from next_offset gives only new lines."""
    h = Harness()
    h.server.logs.append(b"one\ntwo\n")
    code, body, _ = h.call("GET", "/api/v1/servers/A/logs?offset=0&limit=10", headers=AUTH)
    page = json.loads(body)
    assert code == 200 and page["lines"] == ["one", "two"] and page["next_offset"] == 2
    h.server.logs.append(b"three\n")
    _, body, _ = h.call("GET", "/api/v1/servers/A/logs?offset=2", headers=AUTH)
    assert json.loads(body)["lines"] == ["three"]
    assert h.call("GET", "/api/v1/servers/A/logs?offset=x", headers=AUTH)[0] == 400


def test_metrics() -> None:
    """Metrics expose state, ready and restarts per server."""
    h = Harness()
    _, body, _ = h.call("GET", "/api/v1/metrics", headers=AUTH)
    text = body.decode()
    assert 'mortred_supervisor_state{server="A"} 0.0' in text
    assert 'mortred_supervisor_ready{server="A"} 0.0' in text
    assert 'mortred_supervisor_restarts_total{server="A"} 0.0' in text


def test_ui_is_served_and_confined() -> None:
    """/ serves index.html; paths cannot escape the static folder."""
    h = Harness()
    code, body, headers = h.call("GET", "/")
    assert code == 200 and b"<!doctype html" in body.lower()
    assert headers.getRawHeaders("content-type")[0].startswith("text/html")
    assert h.call("GET", "/ui/../../../etc/passwd")[0] == 404


def test_infer_proxy_async_rewrites_to_api_paths() -> None:
    """POST /api/v1/infer {async: true} submits to /jobs with the internal token."""
    h = Harness()
    code, body, _ = h.call(
        "POST",
        "/api/v1/infer",
        headers=AUTH,
        data=json.dumps({"server_id": "A", "async": True, "images": ["x"]}),
    )
    doc = json.loads(body)
    assert code == 202 and doc["poll_url"] == "/api/v1/jobs/A/job_abc"
    seen = h.model.seen[-1]
    assert seen.path == "/jobs" and seen.headers["authorization"] == "Bearer internal"
    assert json.loads(seen.body) == {"images": ["x"]}
    code, _, _ = h.call("GET", "/api/v1/jobs/A/job_known", headers=AUTH)
    assert code == 200 and h.model.seen[-1].path == "/jobs/job_known"
    assert h.call("POST", "/api/v1/infer", headers=AUTH, data=b'{"server_id": "NOPE"}')[0] == 404
