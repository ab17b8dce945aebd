"""The gateway edge end to end in memory: StubTreq → GatewayApp → StubTreq → fake model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.gateway.access import AccessPolicy
from mortred_twisted.gateway.apikeys import ApiKey, KeyRing, hash_key
from mortred_twisted.gateway.ratelimit import RateLimiter
from mortred_twisted.gateway.upstream import UpstreamClient
from mortred_twisted.http.gateway import GatewayApp

from .fakes import FakeModel

# The in-memory transport of RequestTraversalAgent has no abortConnection.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport")

TOKEN = "gw-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Harness:
    def __init__(
        self,
        upstream_http: Any = None,
        keys: list[ApiKey] | None = None,
        recv_timeout_s: float = 5.0,
    ) -> None:
        self.clock = Clock()
        self.model = FakeModel()
        self.sync = FakeModel(server_uri="/mortred/sync/infer", async_enabled=False)
        catalog = Catalog(
            [
                CatalogEntry(
                    "ASYNC", "fake", "127.0.0.1", 18100, "/mortred/fake/infer", True, 16, "a.toml"
                ),
                CatalogEntry(
                    "SYNC", "fake", "127.0.0.2", 18101, "/mortred/sync/infer", False, 16, "s.toml"
                ),
            ]
        )
        self.up_async = RequestTraversalAgent(self.model.resource())
        self.up_sync = RequestTraversalAgent(self.sync.resource())
        harness = self

        class Router:
            """Dispatches to the fake by host, like the pool would by address."""

            def request(self, method: bytes, url: bytes, *a: Any, **kw: Any) -> Any:
                if upstream_http is not None:
                    return upstream_http.request(method, url, *a, **kw)
                stub = harness.up_sync if b"127.0.0.2" in url else harness.up_async
                return stub.request(method, url, *a, **kw)

        self.upstream = UpstreamClient(Router(), self.clock, recv_timeout_s=recv_timeout_s)
        self.policy = AccessPolicy(
            static_token=TOKEN, keys=KeyRing(keys or []), limiter=RateLimiter(self.clock.seconds)
        )
        self.app = GatewayApp(
            catalog=catalog,
            policy=self.policy,
            upstream=self.upstream,
            clock=self.clock,
            internal_token="internal",
            request_id=lambda: "generated-id",
        )
        self.client = StubTreq(self.app.resource())

    def flush(self) -> None:
        for _ in range(3):
            self.up_async.flush()
            self.up_sync.flush()
            self.client.flush()

    def call(self, method: str, path: str, **kw: Any) -> tuple[Any, bytes]:
        d = self.client.request(method, "http://gw" + path, **kw)
        self.flush()
        response = self.successResultOf(d)
        body_d = response.content()
        self.flush()
        return response, self.successResultOf(body_d)

    @staticmethod
    def successResultOf(d: defer.Deferred[Any]) -> Any:
        results: list[Any] = []
        d.addBoth(results.append)
        assert results, "deferred has not fired"
        if isinstance(results[0], Exception) or hasattr(results[0], "raiseException"):
            results[0].raiseException()
        return results[0]


def test_healthz_is_public() -> None:
    """GET /healthz is 200 without a token."""
    h = Harness()
    response, body = h.call("GET", "/healthz")
    assert response.code == 200 and json.loads(body) == {"status": "ok"}


def test_submit_rewrites_location_and_urls_and_forwards_internal_token() -> None:
    """A 202 gets gateway URLs; upstream sees the internal token, not the client's."""
    h = Harness()
    response, body = h.call(
        "POST", "/v1/models/ASYNC/jobs", headers=AUTH, data=b'{"images":["aGk="]}'
    )
    assert response.code == 202
    assert response.headers.getRawHeaders("location") == ["/v1/models/ASYNC/jobs/job_abc"]
    doc = json.loads(body)
    assert doc["poll_url"] == "/v1/models/ASYNC/jobs/job_abc"
    assert doc["result_url"] == "/v1/models/ASYNC/jobs/job_abc/result"
    seen = h.model.seen[-1]
    assert seen.path == "/jobs" and seen.body == b'{"images":["aGk="]}'
    assert seen.headers["authorization"] == "Bearer internal"
    assert seen.headers["x-request-id"] == "generated-id"


def test_request_id_forwarded_both_ways() -> None:
    """A client X-Request-ID reaches the model; the model's reply header comes back."""
    h = Harness()
    response, _ = h.call(
        "POST", "/v1/models/ASYNC/infer", headers={**AUTH, "X-Request-ID": "abc"}, data=b"{}"
    )
    assert h.model.seen[-1].headers["x-request-id"] == "abc"
    assert response.headers.getRawHeaders("x-request-id") == ["req-from-model"]


def test_odd_request_id_is_replaced() -> None:
    """An X-Request-ID that is not a short visible-ASCII token is replaced by a fresh one."""
    h = Harness()
    h.call("POST", "/v1/models/ASYNC/infer", headers={**AUTH, "X-Request-ID": "x" * 300},
           data=b"{}")  # fmt: skip
    assert h.model.seen[-1].headers["x-request-id"] == "generated-id"


def test_statuses_pass_through() -> None:
    """404 unknown job, 409 result, a sync model's /jobs 404 and 429 + Retry-After pass through."""
    h = Harness()
    r, b = h.call("GET", "/v1/models/ASYNC/jobs/job_nope", headers=AUTH)
    assert r.code == 404 and json.loads(b) == {"error": "job not found: job_nope"}
    r, b = h.call("GET", "/v1/models/ASYNC/jobs/job_known/result", headers=AUTH)
    assert r.code == 409
    r, _ = h.call("POST", "/v1/models/SYNC/jobs", headers=AUTH, data=b"{}")
    assert r.code == 404
    h.model.submit_status = 429
    r, b = h.call("POST", "/v1/models/ASYNC/jobs", headers=AUTH, data=b"{}")
    assert r.code == 429 and r.headers.getRawHeaders("retry-after") == ["1"]
    assert "queue full" in json.loads(b)["error"]


def test_wait_query_forwarded() -> None:
    """…/wait?timeout=N reaches the model as /jobs/<id>/wait?timeout=N."""
    h = Harness()
    d = h.client.get("http://gw/v1/models/ASYNC/jobs/job_known/wait?timeout=200", headers=AUTH)
    h.flush()
    assert h.model.seen[-1].path == "/jobs/job_known/wait?timeout=200"
    h.model.waits[-1].callback(b'{"state":"done"}')
    h.flush()
    assert h.successResultOf(d).code == 200


def test_auth_errors() -> None:
    """Missing/wrong token is 401 with WWW-Authenticate; the model never sees it."""
    h = Harness()
    r, _ = h.call("POST", "/v1/models/ASYNC/jobs", data=b"{}")
    assert r.code == 401 and r.headers.getRawHeaders("www-authenticate")
    r, _ = h.call(
        "POST", "/v1/models/ASYNC/jobs", headers={"Authorization": "Bearer x"}, data=b"{}"
    )
    assert r.code == 401
    assert h.model.seen == []


def test_routing_errors() -> None:
    """Unknown model 404 JSON, wrong method 405 + Allow, bare /jobs 404 (T11, T13, T15)."""
    h = Harness()
    r, b = h.call("POST", "/v1/models/NOPE/jobs", headers=AUTH, data=b"{}")
    assert r.code == 404 and "unknown model" in json.loads(b)["error"]
    r, _ = h.call("POST", "/v1/models/ASYNC/jobs/job_known", headers=AUTH)
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET"]
    r, _ = h.call("POST", "/jobs", headers=AUTH, data=b"{}")
    assert r.code == 404
    assert h.model.seen == []


def test_legacy_server_uri_is_sync_infer() -> None:
    """POST {server_uri} on the gateway forwards to that model's sync route."""
    h = Harness()
    r, _ = h.call("POST", "/mortred/sync/infer", headers=AUTH, data=b"{}")
    assert r.code == 200 and h.sync.seen[-1].path == "/mortred/sync/infer"


def test_api_key_rate_limit() -> None:
    """A 1 qps key: the second request in the same second is 429 with Retry-After."""
    h = Harness(keys=[ApiKey("ci", hash_key("key1"), rate_limit_qps=1)])
    hdr = {"Authorization": "Bearer key1"}
    assert h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=hdr)[0].code == 200
    r, _ = h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=hdr)
    assert r.code == 429 and r.headers.getRawHeaders("retry-after") == ["1"]
    h.clock.advance(1)
    assert h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=hdr)[0].code == 200


def test_reload_keys_replaces_ring() -> None:
    """After replace_keys a removed key is 401 and a new one works."""
    h = Harness(keys=[ApiKey("old", hash_key("k-old"))])
    h.policy.replace_keys(KeyRing([ApiKey("new", hash_key("k-new"))]))
    assert (
        h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers={"Authorization": "Bearer k-old"})[
            0
        ].code
        == 401
    )
    assert (
        h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers={"Authorization": "Bearer k-new"})[
            0
        ].code
        == 200
    )


class HangsThenWrappedCancel:
    """Like the real Agent: a cancelled request fails with ResponseNeverReceived."""

    def request(self, method: bytes, url: bytes, *a: Any, **kw: Any) -> Any:
        def cancel(d: defer.Deferred[Any]) -> None:
            d.errback(ResponseNeverReceived([Failure(defer.CancelledError())]))

        return defer.Deferred(cancel)


def test_wrapped_cancel_is_a_cancel_not_502() -> None:
    """A cancel reported as ResponseNeverReceived([CancelledError]) stays a cancel."""
    h = Harness(upstream_http=HangsThenWrappedCancel())
    d = h.upstream.request("GET", "http://127.0.0.1:18100/jobs/x/wait", {})
    failures: list[Any] = []
    d.addErrback(failures.append)
    d.cancel()
    assert failures[0].check(defer.CancelledError)


def test_wrapped_cancel_on_deadline_is_504() -> None:
    """The same wrapped cancel caused by the receive deadline is a 504."""
    h = Harness(upstream_http=HangsThenWrappedCancel(), recv_timeout_s=1)
    r: list[Any] = []
    h.client.get("http://gw/v1/models/ASYNC/jobs/job_known", headers=AUTH).addBoth(r.append)
    h.flush()
    h.clock.advance(1)
    h.flush()
    assert r[0].code == 504


class Refusing:
    def request(self, method: bytes, url: bytes, *a: Any, **kw: Any) -> Any:
        return defer.fail(ConnectionRefusedError("refused"))


class Broken:
    def request(self, method: bytes, url: bytes, *a: Any, **kw: Any) -> Any:
        return defer.fail(RuntimeError("connection reset"))


@pytest.mark.parametrize(("http", "status"), [(Refusing(), 503), (Broken(), 502)])
def test_upstream_failures(http: Any, status: int) -> None:
    """Refused → 503 (model not running); other transport failures → 502."""
    h = Harness(upstream_http=http)
    r, b = h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=AUTH)
    assert r.code == status and "ASYNC" in json.loads(b)["error"]


def test_upstream_slower_than_recv_timeout_is_504() -> None:
    """A wait that outlives upstream_recv_timeout_ms is cut with 504 and cancelled upstream."""
    h = Harness(recv_timeout_s=2.0)
    d = h.client.get("http://gw/v1/models/ASYNC/jobs/job_known/wait?timeout=120000", headers=AUTH)
    results: list[Any] = []
    d.addBoth(results.append)
    h.flush()
    assert results == [] and len(h.model.waits) == 1
    h.clock.advance(2.0)
    h.flush()
    assert results[0].code == 504
    assert h.model.cancelled == ["job_known"]


def test_client_disconnect_cancels_upstream() -> None:
    """Cancelling the gateway's forward (Klein does it on disconnect) cancels the upstream wait."""
    h = Harness()
    forwarded: list[defer.Deferred[Any]] = []
    real = h.upstream.request

    def spy(*a: Any, **kw: Any) -> Any:
        d = real(*a, **kw)
        forwarded.append(d)
        return d

    h.upstream.request = spy  # type: ignore[method-assign]
    h.client.get("http://gw/v1/models/ASYNC/jobs/job_known/wait", headers=AUTH)
    h.flush()
    assert len(forwarded) == 1
    forwarded[0].cancel()
    forwarded[0].addErrback(lambda f: None)
    assert forwarded[0].called and not h.clock.getDelayedCalls()


def test_metrics_counts_routes() -> None:
    """GET /metrics (token) shows requests by route and status, and auth failures."""
    h = Harness()
    h.call("POST", "/v1/models/ASYNC/jobs", data=b"{}")
    h.call("POST", "/v1/models/ASYNC/jobs", headers=AUTH, data=b"{}")
    r, body = h.call("GET", "/metrics", headers=AUTH)
    text = body.decode()
    assert r.code == 200
    assert 'mortred_gateway_requests_total{route="jobs_submit",status="202"} 1.0' in text
    assert 'mortred_gateway_auth_failures_total{reason="missing"} 1.0' in text


#: Hot routes, errors, health and auth failures, for the answer-alike tests.
ALIKE_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/healthz", {}),
    ("POST", "/healthz", {}),
    ("GET", "/v1/models/ASYNC/jobs/job_known", {"headers": AUTH}),
    ("GET", "/v1/models/ASYNC/jobs/job_nope", {"headers": AUTH}),
    ("GET", "/v1/models/ASYNC/jobs/job_known/result", {"headers": AUTH}),
    ("POST", "/v1/models/ASYNC/jobs", {"headers": AUTH, "data": b"{}"}),
    ("POST", "/v1/models/ASYNC/infer", {"headers": AUTH, "data": b"{}"}),
    ("POST", "/mortred/sync/infer", {"headers": AUTH, "data": b"{}"}),
    ("GET", "/v1/models/ASYNC/infer", {"headers": AUTH}),
    ("GET", "/v1/models/NOPE/jobs/x", {"headers": AUTH}),
    ("GET", "/v1/models/ASYNC/jobs/x", {}),
    ("GET", "/v1/models/ASYNC/jobs/x", {"headers": {"Authorization": "Bearer nope"}}),
    ("GET", "/jobs/x", {"headers": AUTH}),
    ("GET", "/metrics", {}),
]


def test_fast_resource_and_klein_answer_alike() -> None:
    """GatewayResource (served) and the Klein resource give the same status, headers
    and body for hot routes, errors, health and auth failures."""
    from treq.testing import StubTreq as Stub

    answers = []
    for klein in (False, True):
        h = Harness()
        if klein:
            h.client = Stub(h.app.klein_resource())
        seen = []
        for method, path, kw in ALIKE_CALLS:
            r, body = h.call(method, path, **kw)
            headers = {
                k.lower(): v
                for k, v in r.headers.getAllRawHeaders()
                if k.lower() not in (b"date", b"server")
            }
            seen.append((r.code, headers, body))
        answers.append(seen)
    assert answers[0] == answers[1]


def raw_call(h: Harness, lean: bool, method: str, path: str,
             headers: dict[str, str] | None = None, data: bytes | None = None
             ) -> tuple[int, dict[bytes, list[bytes]], bytes]:  # fmt: skip
    """One request in memory through the served lean server (gateway/server.py), or
    through twisted.web serving ``GatewayResource``: (status, headers, body)."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport
    from twisted.web.server import Site

    from mortred_twisted.gateway.server import GatewayServerFactory

    factory: Any = (
        GatewayServerFactory(h.app, clock=h.clock, max_body_bytes=1 << 20)
        if lean
        else Site(h.app.resource())
    )
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    transport = StringTransport()
    proto.makeConnection(transport)
    lines = [f"{method} {path} HTTP/1.1", "Host: gw"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if data is not None:
        lines.append(f"Content-Length: {len(data)}")
    proto.dataReceived(("\r\n".join(lines) + "\r\n\r\n").encode() + (data or b""))
    h.flush()
    head, _, body = transport.value().partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    found: dict[bytes, list[bytes]] = {}
    for line in header_lines:
        name, _, value = line.partition(b": ")
        found.setdefault(name.lower(), []).append(value)
    return int(status_line.split(b" ")[1]), found, body


def test_lean_server_and_twisted_web_answer_alike() -> None:
    """The served lean HTTP server and twisted.web (GatewayResource) give the same
    status, headers and body for hot routes, errors, health and auth failures."""
    skip = (b"date", b"server", b"connection")
    for method, path, kw in ALIKE_CALLS:
        answers = []
        for lean in (True, False):
            code, headers, body = raw_call(Harness(), lean, method, path, **kw)
            answers.append((code, {k: v for k, v in headers.items() if k not in skip}, body))
        assert answers[0] == answers[1], (method, path)
