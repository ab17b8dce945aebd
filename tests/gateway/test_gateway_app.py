"""The gateway as production pairs it, in memory: raw HTTP/1.1 bytes → the gateway's
server (http11/server.py) → GatewayApp → the lean upstream pool (http11/pool.py) →
twisted.web serving a fake model, over iosim loopback connections."""

from __future__ import annotations

import json

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.web.http_headers import Headers
from twisted.web.server import Site

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.gateway.access import AccessPolicy
from mortred_twisted.gateway.apikeys import ApiKey, KeyRing, hash_key
from mortred_twisted.http.gateway import GatewayApp
from mortred_twisted.http11.pool import LeanUpstreamClient
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.http11.server import HTTPServerFactory

from .fakes import FakeModel

TOKEN = "gw-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Response:
    """One parsed answer of the gateway (``code``, ``headers`` as twisted ``Headers``)."""

    def __init__(self, code: int, headers: Headers) -> None:
        self.code = code
        self.headers = headers


def parse_response(raw: bytes) -> tuple[Response, bytes, bytes] | None:
    """(response, body, rest) of the first complete answer in ``raw`` (the gateway
    always sends a Content-Length), or None while it is incomplete."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *lines = head.split(b"\r\n")
    headers = Headers()
    for line in lines:
        name, _, value = line.partition(b": ")
        headers.addRawHeader(name, value)
    length = int((headers.getRawHeaders(b"content-length") or [b"0"])[0])
    if len(rest) < length:
        return None
    return Response(int(status_line.split(b" ")[1]), headers), rest[:length], rest[length:]


class Client:
    """One client connection to the gateway's server (a StringTransport)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.proto = harness.server.buildProtocol(IPv4Address("TCP", "10.0.0.9", 4444))
        self.transport = StringTransport()
        self.proto.makeConnection(self.transport)

    def send(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> None:
        lines = [f"{method} {path} HTTP/1.1", "Host: gw"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if data is not None:
            lines.append(f"Content-Length: {len(data)}")
            if data and not any(k.lower() == "content-type" for k in headers or {}):
                lines.append("Content-Type: application/json")
        self.proto.dataReceived(("\r\n".join(lines) + "\r\n\r\n").encode() + (data or b""))
        self.harness.flush()

    def answer(self) -> tuple[Response, bytes] | None:
        parsed = parse_response(self.transport.value())
        if parsed is None:
            return None
        response, body, rest = parsed
        self.transport.clear()
        self.transport.write(rest)
        return response, body


class Harness:
    """Gateway server + GatewayApp + lean pool, connected in memory to two fake
    models (twisted.web ``Site`` s). ``upstream``: "ok", "refuse" (connections
    refused) or "reset" (connections lost before any answer)."""

    def __init__(
        self,
        keys: list[ApiKey] | None = None,
        recv_timeout_s: float = 5.0,
        upstream: str = "ok",
        replicas: int = 1,
    ) -> None:
        self.clock = MemoryReactorClock()
        self.model = FakeModel()
        self.sync = FakeModel(server_uri="/mortred/sync/infer", async_enabled=False)
        #: (host, port) pairs that refuse connections whatever ``upstream`` says
        self.refused: set[tuple[str, int]] = set()
        catalog = Catalog(
            [
                CatalogEntry(
                    "ASYNC",
                    "fake",
                    "127.0.0.1",
                    18100,
                    "/mortred/fake/infer",
                    True,
                    16,
                    "a.toml",
                    replicas=replicas,
                ),
                CatalogEntry(
                    "SYNC", "fake", "127.0.0.2", 18101, "/mortred/sync/infer", False, 16, "s.toml"
                ),
            ]
        )
        self.sites = {
            ("127.0.0.1", 18100): Site(self.model.resource(), reactor=self.clock, timeout=None),
            ("127.0.0.2", 18101): Site(self.sync.resource(), reactor=self.clock, timeout=None),
        }
        for i in range(1, replicas):  # replicas share the model (a shared job store)
            self.sites[("127.0.0.1", 18100 + i)] = self.sites[("127.0.0.1", 18100)]
        self.mode = upstream
        self._accepted = 0
        self.pumps: list[iosim.IOPump] = []
        self.upstream = LeanUpstreamClient(self.clock, recv_timeout_s=recv_timeout_s)
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
        self.server = HTTPServerFactory(self.app, clock=self.clock, max_body_bytes=1 << 20)

    def flush(self) -> None:
        """Complete pending upstream connects, then move bytes until nothing moves."""
        for _ in range(10):
            while self._accepted < len(self.clock.tcpClients):
                host, port, factory, _t, _b = self.clock.tcpClients[self._accepted]
                self._accepted += 1
                if self.mode == "refuse" or (host, port) in self.refused:
                    factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))
                    continue
                client = factory.buildProtocol(None)
                if self.mode == "reset":
                    client.makeConnection(StringTransport())
                    client.connectionLost(Failure(ConnectionLost("reset by peer")))
                    continue
                server = self.sites[(host, port)].buildProtocol(None)
                server_io = iosim.FakeTransport(server, isServer=True)
                client_io = iosim.FakeTransport(client, isServer=False)
                self.pumps.append(iosim.connect(server, server_io, client, client_io))
            moved = any([pump.pump() for pump in self.pumps])
            if not moved and self._accepted == len(self.clock.tcpClients):
                return

    def call(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[Response, bytes]:
        """One request on a fresh client connection; its complete answer."""
        client = Client(self)
        client.send(method, path, headers, data)
        answer = client.answer()
        assert answer is not None, "no complete answer"
        return answer


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
    client = Client(h)
    client.send("GET", "/v1/models/ASYNC/jobs/job_known/wait?timeout=200", AUTH)
    assert h.model.seen[-1].path == "/jobs/job_known/wait?timeout=200"
    assert client.answer() is None
    h.model.waits[-1].callback(b'{"state":"done"}')
    h.flush()
    answer = client.answer()
    assert answer is not None and answer[0].code == 200 and answer[1] == b'{"state":"done"}'


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
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET, DELETE"]
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


@pytest.mark.parametrize(("mode", "status"), [("refuse", 503), ("reset", 502)])
def test_upstream_failures(mode: str, status: int) -> None:
    """Refused → 503 (model not running); a connection lost before the answer → 502."""
    h = Harness(upstream=mode)
    r, b = h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=AUTH)
    assert r.code == status and "ASYNC" in json.loads(b)["error"]


def test_upstream_slower_than_recv_timeout_is_504() -> None:
    """A wait that outlives upstream_recv_timeout_ms is cut with 504 and cancelled upstream."""
    h = Harness(recv_timeout_s=2.0)
    client = Client(h)
    client.send("GET", "/v1/models/ASYNC/jobs/job_known/wait?timeout=120000", AUTH)
    assert client.answer() is None and len(h.model.waits) == 1
    h.clock.advance(2.0)
    h.flush()
    answer = client.answer()
    assert answer is not None and answer[0].code == 504
    assert h.model.cancelled == ["job_known"]


def test_client_disconnect_cancels_upstream() -> None:
    """A client that goes away mid-/wait cancels the model's wait (the upstream
    connection is dropped) and leaves no timer behind."""
    h = Harness()
    client = Client(h)
    client.send("GET", "/v1/models/ASYNC/jobs/job_known/wait", AUTH)
    assert len(h.model.waits) == 1 and h.model.cancelled == []
    client.proto.connectionLost(Failure(ConnectionLost("client went away")))
    h.flush()
    assert h.model.cancelled == ["job_known"]
    assert h.upstream.idle_count("127.0.0.1", 18100) == 0
    assert not h.clock.getDelayedCalls()


def test_pipelined_requests_through_the_pool_answer_in_order() -> None:
    """Two requests in one read on one client connection: answered in order, the
    upstream connection reused for the second."""
    h = Harness()
    client = Client(h)
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    one = b"GET /v1/models/ASYNC/jobs/job_known HTTP/1.1\r\nHost: gw\r\n" + auth + b"\r\n"
    two = b"GET /v1/models/ASYNC/jobs/job_nope HTTP/1.1\r\nHost: gw\r\n" + auth + b"\r\n"
    client.proto.dataReceived(one + two)
    h.flush()
    first, second = client.answer(), client.answer()
    assert first is not None and second is not None
    assert (first[0].code, second[0].code) == (200, 404)
    assert len(h.clock.tcpClients) == 1 and h.upstream.idle_count("127.0.0.1", 18100) == 1


def test_large_body_reaches_the_model_whole() -> None:
    """A body far over one socket write goes through server and pool intact."""
    h = Harness()
    body = b'{"images":["' + b"A" * 300_000 + b'"]}'
    r, _ = h.call("POST", "/v1/models/ASYNC/jobs", headers=AUTH, data=body)
    assert r.code == 202 and h.model.seen[-1].body == body


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


#: Every kind of gateway route: hot routes, errors, health, metrics, auth failures.
ROUTES: list[tuple[str, dict[str, str]]] = [
    ("/healthz", {}),
    ("/metrics", AUTH),
    ("/metrics", {}),
    ("/v1/models/ASYNC/jobs/job_known", AUTH),
    ("/v1/models/ASYNC/jobs/job_nope", AUTH),
    ("/v1/models/ASYNC/jobs/job_known/result", AUTH),
    ("/v1/models/ASYNC/jobs/job_known/wait", AUTH),
    ("/v1/models/ASYNC/jobs/job_known/events", AUTH),
    ("/v1/models/ASYNC/jobs", AUTH),
    ("/v1/models/ASYNC/infer", AUTH),
    ("/v1/models/NOPE/jobs/x", AUTH),
    ("/v1/models/ASYNC/jobs/x", {}),
    ("/jobs/x", AUTH),
]


def test_head_writes_no_body_on_any_route() -> None:
    """HEAD on every route shape (forwarded, refused, local) is answered with a head
    and no body byte, and the connection stays usable."""
    for path, headers in ROUTES:
        h = Harness()
        client = Client(h)
        lines = [f"HEAD {path} HTTP/1.1", "Host: gw"] + [f"{k}: {v}" for k, v in headers.items()]
        client.proto.dataReceived(("\r\n".join(lines) + "\r\n\r\n").encode())
        h.flush()
        if h.model.waits:  # a forwarded wait: let it end
            h.model.waits[0].callback(b"{}")
        for _request, stream in h.model.streams:  # a forwarded stream: end it
            stream.callback(b"")
        h.flush()
        raw = client.transport.value()
        head, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep and head.startswith(b"HTTP/1.1 "), (path, raw[:200])
        assert rest == b"", (path, head, rest[:100])


def test_an_open_gateway_answers_only_loopback_host_names() -> None:
    """No token and no keys (loopback only): a Host that is not a loopback name is a
    421 (DNS rebinding), before routing; localhost is served; nosniff everywhere."""
    h = Harness()
    h.app.policy = AccessPolicy(
        static_token="", keys=KeyRing([]), limiter=RateLimiter(h.clock.seconds)
    )
    for host in ("evil.example", "127.0.0.1.nip.io"):
        client = Client(h)
        client.proto.dataReceived(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        response, body = client.answer() or (None, b"")
        assert response is not None and response.code == 421 and b"loopback" in body
        assert response.headers.getRawHeaders("x-content-type-options") == ["nosniff"]
    client = Client(h)
    client.proto.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: localhost:8080\r\n\r\n")
    answer = client.answer()
    assert answer is not None and answer[0].code == 200


@pytest.mark.parametrize(
    ("method", "path", "auth"),
    [
        ("GET", "/healthz", False),
        ("GET", "/metrics", False),
        ("POST", "/healthz", False),
        ("GET", "/v1/models/ASYNC/jobs/job_known", True),
        ("DELETE", "/v1/models/ASYNC/jobs/job_known", True),
        ("GET", "/v1/models/ASYNC/jobs/job_known/events", True),
    ],
)
def test_a_body_on_a_route_that_takes_none_is_refused_from_its_head(
    method: str, path: str, auth: bool
) -> None:
    """A head announcing a body to a route that takes none (health, metrics, job
    reads, cancel) is answered from the head, before a body byte or 100 Continue,
    and holds none of the body budget (before: /healthz and /metrics skipped the head
    decision and let any client announce 16 MB there)."""
    h = Harness()
    h.server.body_budget_bytes = 1 << 20
    client = Client(h)
    extra = f"Authorization: Bearer {TOKEN}\r\n" if auth else ""
    client.proto.dataReceived(
        f"{method} {path} HTTP/1.1\r\nHost: gw\r\n{extra}Content-Length: 900000\r\n"
        "Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    h.flush()
    raw = client.transport.value()
    assert b"100 Continue" not in raw and client.transport.disconnecting, raw[:200]
    status = int(raw.split(b" ", 2)[1])
    assert status in (405, 413), raw[:200]  # POST /healthz: 405 as without a body
    if status == 413:
        assert b"takes no request body" in raw
    assert h.server.body_bytes_held == 0 and h.model.seen == []
