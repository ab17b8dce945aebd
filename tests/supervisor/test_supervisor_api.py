"""The supervisor REST API in memory: auth, status, actions, logs, metrics, UI, proxy,
and the jobs page's routes (listing, cancel, live events relayed as a stream)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from klein import Klein
from treq.testing import RequestTraversalAgent
from twisted.internet import defer, error
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.web.server import Site

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.http.supervisor_api import CONTENT_SECURITY_POLICY, STATIC, SupervisorApi
from mortred_twisted.http11.pool import LeanUpstreamClient
from mortred_twisted.http11.upstream import UpstreamClient
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.metrics import supervisor_registry
from mortred_twisted.supervisor.monitor import ManagedServer, Supervisor, Timing
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.process import ProcessSpec
from tests.support.memory_http import MemoryClient

from ..gateway.fakes import FakeModel
from .fakes import FakeProber, FakeSpawner

# The in-memory transport of RequestTraversalAgent has no abortConnection.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport")

AUTH = {"Authorization": "Bearer mgmt"}


class Harness:
    def __init__(self, upstream: Any = None, api_token: str = "mgmt") -> None:
        self.clock = MemoryReactorClock()
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
        self.upstream = RequestTraversalAgent(upstream or self.model.resource())
        # Event streams: the lean stream client, connected in memory to the model's
        # resource (a twisted.web Site of the fake) by iosim pumps.
        self.model_site = Site(upstream or self.model.resource(), reactor=self.clock, timeout=None)
        self.streams = LeanUpstreamClient(self.clock, recv_timeout_s=5)
        self.refuse_streams = False
        self.pumps: list[Any] = []
        self._accepted = 0
        api = SupervisorApi(
            supervisor=self.supervisor,
            catalog=self.catalog,
            api_token=api_token,
            registry=supervisor_registry(self.supervisor),
            proxy=UpstreamClient(self.upstream, self.clock, recv_timeout_s=5),
            streams=self.streams,
            internal_token="internal",
        )
        self.server_factory = api.http_server(self.clock)
        self.client = MemoryClient(self.server_factory)

    def call(
        self, method: str, path: str, origin: str = "http://sup", **kw: Any
    ) -> tuple[int, bytes, Any]:
        if kw.get("data") is not None:  # as the web UI sends its JSON
            kw["headers"] = {"Content-Type": "application/json", **kw.get("headers", {})}
        d = self.client.request(method, origin + path, **kw)
        self.flush()
        out: list[Any] = []
        d.addCallback(lambda r: r.content().addCallback(lambda b: out.append((r, b))))
        self.flush()
        response, body = out[0]
        return response.code, body, response.headers

    def flush(self) -> None:
        for _ in range(5):
            self.upstream.flush()
            while self._accepted < len(self.clock.tcpClients):
                _host, _port, factory, _t, _b = self.clock.tcpClients[self._accepted]
                self._accepted += 1
                if self.refuse_streams:
                    factory.clientConnectionFailed(None, Failure(error.ConnectionRefusedError()))
                    continue
                client = factory.buildProtocol(None)
                server = self.model_site.buildProtocol(None)
                server_io = iosim.FakeTransport(server, isServer=True)
                client_io = iosim.FakeTransport(client, isServer=False)
                self.pumps.append(iosim.connect(server, server_io, client, client_io))
            for pump in self.pumps:
                pump.pump()
            self.client.flush()


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


SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _security_headers(headers: Any) -> dict[str, str | None]:
    return {name: (headers.getRawHeaders(name) or [None])[0] for name in SECURITY_HEADERS}


def test_every_ui_file_and_the_index_carry_the_browser_security_headers() -> None:
    """/ and every file under /ui/ come with the CSP, X-Frame-Options: DENY, nosniff
    and no referrer, with the right content type."""
    h = Harness()
    names = sorted(p.name for p in STATIC.iterdir() if p.is_file())
    assert {"index.html", "app.js", "style.css"} <= set(names)
    for path in ["/", *(f"/ui/{n}" for n in names)]:
        code, _, headers = h.call("GET", path)
        assert code == 200, path
        assert _security_headers(headers) == SECURITY_HEADERS, path
    js = h.call("GET", "/ui/app.js")[2].getRawHeaders("content-type")[0]
    assert js.split(";")[0] in ("text/javascript", "application/javascript")


def test_json_errors_and_refusals_carry_the_security_headers_too() -> None:
    """nosniff and the rest are on every answer: JSON, 401, 404, 405."""
    h = Harness()
    for method, path, kw in [
        ("GET", "/api/v1/health", {}),
        ("GET", "/api/v1/status", {"headers": AUTH}),
        ("GET", "/api/v1/status", {}),
        ("GET", "/nope", {}),
        ("GET", "/ui/missing.js", {}),
        ("PUT", "/api/v1/status", {"headers": AUTH}),
    ]:
        headers = h.call(method, path, **kw)[2]
        assert _security_headers(headers) == SECURITY_HEADERS, (method, path)


def test_the_csp_allows_no_inline_script_or_style() -> None:
    """The policy names no 'unsafe-inline'/'unsafe-eval', forbids framing, and the
    shipped page has no inline script, style or event handler for it to block."""
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
    assert "<style" not in html and " style=" not in html
    assert re.findall(r"\son[a-z]+\s*=", html) == []
    js = (STATIC / "app.js").read_text()
    # A style attribute (through el() or setAttribute) would be blocked; CSSOM is not.
    assert "style:" not in js and '"style"' not in js


@pytest.mark.parametrize(
    "origin",
    ["http://localhost:8787", "http://127.0.0.1:8787", "http://localhost", "http://127.0.0.2"],
)
def test_without_a_token_loopback_host_names_are_served(origin: str) -> None:
    """A supervisor without a token answers requests whose Host names loopback
    (``[::1]``, which the in-memory client cannot send, is in tests/http/test_auth.py)."""
    h = Harness(api_token="")
    assert h.call("GET", "/api/v1/status", origin=origin)[0] == 200
    assert h.call("GET", "/", origin=origin)[0] == 200


@pytest.mark.parametrize(
    "origin", ["http://evil.example:8787", "http://127.0.0.1.nip.io:8787", "http://10.0.0.7:8787"]
)
def test_without_a_token_other_host_names_are_refused(origin: str) -> None:
    """DNS rebinding: a supervisor without a token answers 421 with a JSON message to
    a Host that is not loopback, on the UI and the API alike, and acts on nothing."""
    h = Harness(api_token="")
    for method, path in [("GET", "/"), ("GET", "/api/v1/status"),
                         ("POST", "/api/v1/servers/A/start")]:  # fmt: skip
        code, body, headers = h.call(method, path, origin=origin)
        assert code == 421, (method, path)
        assert "not a loopback name" in json.loads(body)["error"]
        assert _security_headers(headers) == SECURITY_HEADERS
    assert h.server.state == "stopped" and h.spawner.children == []


def test_with_a_token_any_host_name_is_served() -> None:
    """With a token the bearer check defends the API: any Host is answered."""
    h = Harness()
    assert h.call("GET", "/api/v1/status", origin="http://evil.example", headers=AUTH)[0] == 200
    assert h.call("GET", "/api/v1/status", origin="http://evil.example")[0] == 401


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


# -- the jobs page's routes ------------------------------------------------------------------

STATUS = {"job_id": "job_1", "state": "running", "poll_url": "/jobs/job_1",
          "result_url": "/jobs/job_1/result"}  # fmt: skip


def sse(name: str, doc: dict[str, Any], seq: int) -> bytes:
    return f"id: {seq}\nevent: {name}\ndata: {json.dumps(doc)}\n\n".encode()


class JobsModel:
    """A model port's job-control routes: listing, cancel, and an event stream the
    test writes to (``push``/``end``) and whose disconnect it observes (``gone``)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []  # method, uri, authorization
        self.stream: Any = None
        self.ended: defer.Deferred[bytes] | None = None
        self.gone = False

    def resource(self) -> Any:
        app = Klein()
        model = self

        def record(request: Any) -> None:
            auth = request.getHeader(b"authorization") or b""
            model.seen.append((request.method.decode(), request.uri.decode(), auth.decode()))

        def js(request: Any, status: int, doc: Any) -> bytes:
            request.setResponseCode(status)
            request.setHeader(b"Content-Type", b"application/json")
            return json.dumps(doc).encode()

        @app.route("/jobs", methods=["GET"])
        def listing(request: Any) -> bytes:
            record(request)
            return js(request, 200, {"jobs": [STATUS], "next_cursor": "c1"})

        @app.route("/queue", methods=["GET"])
        def queue(request: Any) -> bytes:
            record(request)
            return js(request, 200, {"depth": 1, "pending": 1, "running": 0, "callers": []})

        @app.route("/jobs/<job>", methods=["DELETE"])
        def cancel(request: Any, job: str) -> bytes:
            record(request)
            if job == "job_done":
                return js(request, 409, {"error": "job already finished (state: done)"})
            doc = {**STATUS, "job_id": job, "poll_url": f"/jobs/{job}", "cancel_requested": True}
            return js(request, 202, doc)

        @app.route("/jobs/<job>/events", methods=["GET"])
        def events(request: Any, job: str) -> Any:
            record(request)
            if job != "job_1":
                return js(request, 404, {"error": f"job not found: {job}"})
            request.setHeader(b"Content-Type", b"text/event-stream; charset=utf-8")
            request.setHeader(b"Cache-Control", b"no-cache")
            request.write(b"retry: 2000\n\n" + sse("state", STATUS, 1))
            model.stream = request
            request.notifyFinish().addErrback(lambda _: setattr(model, "gone", True))
            model.ended = defer.Deferred()
            return model.ended

        return app.resource()

    def push(self, data: bytes) -> None:
        self.stream.write(data)

    def end(self, data: bytes) -> None:
        assert self.ended is not None
        self.ended.callback(data)


class Collector(Protocol):
    """Reads a response body chunk by chunk, as a browser's stream reader does."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.reason: Failure | None = None

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.reason = reason

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode()


def open_stream(h: Harness, path: str) -> tuple[Any, Collector]:
    got: list[Any] = []
    h.client.request("GET", "http://sup" + path, headers=AUTH).addCallback(got.append)
    h.flush()
    assert got, "no response head"
    collector = Collector()
    got[0].deliverBody(collector)
    h.flush()
    return got[0], collector


def test_job_listing_passes_the_query_and_rewrites_urls() -> None:
    """GET /api/v1/jobs/A lists the model's jobs with their URLs under /api/v1/jobs/A/."""
    m = JobsModel()
    h = Harness(m.resource())
    code, body, _ = h.call("GET", "/api/v1/jobs/A?state=pending,running&limit=5&x=1", headers=AUTH)
    doc = json.loads(body)
    assert code == 200 and doc["next_cursor"] == "c1"
    assert doc["jobs"][0]["poll_url"] == "/api/v1/jobs/A/job_1"
    assert doc["jobs"][0]["result_url"] == "/api/v1/jobs/A/job_1/result"
    method, uri, auth = m.seen[-1]
    assert (method, auth) == ("GET", "Bearer internal")
    assert uri == "/jobs?state=pending%2Crunning&limit=5"  # known keys only
    assert h.call("GET", "/api/v1/jobs/NOPE", headers=AUTH)[0] == 404
    assert h.call("GET", "/api/v1/jobs/A")[0] == 401


def test_the_queue_is_relayed_with_the_internal_token() -> None:
    """GET /api/v1/queue/A answers the model's GET /queue (sent with the internal
    token, no principal: every caller); unknown model 404, no token 401."""
    m = JobsModel()
    h = Harness(m.resource())
    code, body, _ = h.call("GET", "/api/v1/queue/A", headers=AUTH)
    assert code == 200 and json.loads(body)["depth"] == 1
    assert m.seen[-1] == ("GET", "/queue", "Bearer internal")
    assert h.call("GET", "/api/v1/queue/NOPE", headers=AUTH)[0] == 404
    assert h.call("GET", "/api/v1/queue/A")[0] == 401


def test_cancel_is_forwarded_as_delete() -> None:
    """DELETE /api/v1/jobs/A/<job> cancels on the model; its 202 and 409 pass through."""
    m = JobsModel()
    h = Harness(m.resource())
    code, body, _ = h.call("DELETE", "/api/v1/jobs/A/job_7", headers=AUTH)
    assert code == 202 and json.loads(body)["cancel_requested"] is True
    assert json.loads(body)["poll_url"] == "/api/v1/jobs/A/job_7"
    assert m.seen[-1] == ("DELETE", "/jobs/job_7", "Bearer internal")
    assert h.call("DELETE", "/api/v1/jobs/A/job_done", headers=AUTH)[0] == 409
    assert h.call("DELETE", "/api/v1/jobs/A/job_7")[0] == 401
    assert h.call("DELETE", "/api/v1/jobs/A/bad%20id", headers=AUTH)[0] == 404


def test_events_are_relayed_as_they_arrive_and_the_end_ends_the_stream() -> None:
    """The first event reaches the client while the job runs, with job URLs under
    /api/v1/jobs/A/; the terminal one ends the stream."""
    m = JobsModel()
    h = Harness(m.resource())
    response, body = open_stream(h, "/api/v1/jobs/A/job_1/events")
    assert response.code == 200
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/event-stream")
    assert response.headers.getRawHeaders("x-accel-buffering") == ["no"]
    assert "retry: 2000" in body.text and "event: state" in body.text
    assert m.seen[-1] == ("GET", "/jobs/job_1/events", "Bearer internal")
    assert body.reason is None  # still open: the job has not ended
    # data lines are rewritten (the model's own JSON formatting kept)
    assert '"/api/v1/jobs/A/job_1"' in body.text and '"/jobs/job_1"' not in body.text
    record = sse("progress", {**STATUS, "progress": {"step": 3, "total": 10}}, 2)
    m.push(record[:-30])  # a record split mid-line: relayed once it is complete
    h.flush()
    assert "event: progress" not in body.text
    m.push(record[-30:])
    h.flush()
    assert '"step": 3' in body.text and body.reason is None
    m.end(sse("done", {**STATUS, "state": "done"}, 3))
    h.flush()
    assert "event: done" in body.text
    assert body.reason is not None and body.reason.check(error.ConnectionDone, Exception)


def test_a_client_that_leaves_closes_the_model_stream() -> None:
    """Disconnecting from the supervisor's stream closes the upstream one."""
    m = JobsModel()
    h = Harness(m.resource())
    _, body = open_stream(h, "/api/v1/jobs/A/job_1/events")
    assert "event: state" in body.text and not m.gone
    assert body.transport is not None
    body.transport.stopProducing()  # the browser closes its reader
    h.flush()
    assert m.gone


def test_events_errors_are_json() -> None:
    """Unknown job → the model's 404; model down → 503; no token → 401; bad id → 404."""
    m = JobsModel()
    h = Harness(m.resource())
    code, body, _ = h.call("GET", "/api/v1/jobs/A/job_x/events", headers=AUTH)
    assert code == 404 and "job not found" in json.loads(body)["error"]
    assert h.call("GET", "/api/v1/jobs/A/job_1/events")[0] == 401
    assert h.call("GET", "/api/v1/jobs/A/j%C3%A9b/events", headers=AUTH)[0] == 404

    down = Harness(m.resource())
    down.refuse_streams = True
    code, body, _ = down.call("GET", "/api/v1/jobs/A/job_1/events", headers=AUTH)
    assert code == 503 and "model not running" in json.loads(body)["error"]


def test_head_writes_no_body_on_any_route() -> None:
    """HEAD on every GET route (UI files, REST, the job proxy and its event stream),
    followed by a GET on the same connection: each HEAD answer is a head alone."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    m = JobsModel()
    h = Harness(m.resource())
    paths = ["/", "/ui/app.js", "/api/v1/health", "/api/v1/status", "/api/v1/catalog",
             "/api/v1/servers/A", "/api/v1/servers/A/logs", "/api/v1/metrics", "/api/v1/jobs/A",
             "/api/v1/jobs/A/job_1", "/api/v1/jobs/A/job_1/events", "/api/v1/nowhere"]  # fmt: skip
    auth = b"Authorization: Bearer mgmt\r\n"
    for path in paths:
        proto = h.server_factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(
            b"HEAD " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"\r\n"
            + b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )  # fmt: skip
        for _ in range(3):
            h.flush()
            h.clock.advance(0)
        head, _, rest = transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 "), (path, head)
        assert rest.startswith(b"HTTP/1.1 200"), (path, rest[:80])
