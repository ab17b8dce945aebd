"""The model port on llhttp in memory: a real ModelServerApp behind ModelPortFactory,
a StringTransport per connection, task.Clock and hand-stepped threads."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.http11.test_server import responses

IMG = base64.b64encode(b"pixels").decode()
TOKEN = "port-token"
AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


class Port:
    """One model app, its llhttp factory, and helpers to open connections."""

    def __init__(self, **server: Any) -> None:
        doc = {
            "server": {"id": "T", "server_uri": "/infer", "worker_nums": 1,
                       "async_enabled": True, "auth_token": TOKEN, "request_size_limit": 0.001,
                       **server},
            "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1},
        }  # fmt: skip
        config = build_server_config(doc, env={})
        self.clock, self.threads = Clock(), HandThreads()
        runtime = ModelRuntime(
            config, clock=self.clock, threads=self.threads, metrics=ServerMetrics(),
            build_model=lambda _t, options, root: create_fake(options, root),
        )  # fmt: skip
        runtime.load_models()
        self.threads.step()
        self.app = ModelServerApp(runtime)
        self.finished: list[Any] = []
        self.factory = ModelPortFactory.for_app(
            self.app, self.clock, on_finished=self.finished.append
        )
        self.port_app = self.factory.port_app
        self.factory.doStart()

    def connect(self) -> tuple[Any, StringTransport]:
        proto = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        assert proto is not None
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport

    def exchange(self, raw: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
        proto, transport = self.connect()
        proto.dataReceived(raw)
        self.clock.advance(0)
        return responses(transport.value())


def post(path: bytes, body: bytes, headers: bytes = b"") -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: m\r\n" + AUTH + headers
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


def get(path: bytes, method: bytes = b"GET") -> bytes:
    return method + b" " + path + b" HTTP/1.1\r\nHost: m\r\n" + AUTH + b"\r\n"


def test_hot_and_other_routes_answer_through_the_same_handlers() -> None:
    """Submit (hot), status (hot), the job list and /ready (werkzeug) on one
    keep-alive connection, answered in order, each counted once when finished."""
    port = Port()
    proto, transport = port.connect()
    proto.dataReceived(post(b"/jobs", json.dumps({"images": [IMG]}).encode()))
    [(code, headers, body)] = responses(transport.value())
    assert code == 202 and headers[b"server"] == b"mortred-model"
    assert headers[b"location"].startswith(b"/jobs/job_")
    job = json.loads(body)["job_id"]
    transport.clear()
    proto.dataReceived(get(f"/jobs/{job}".encode()) + get(b"/jobs?limit=1") + get(b"/ready"))
    answers = responses(transport.value())
    assert [a[0] for a in answers] == [200, 200, 200]
    assert json.loads(answers[0][2])["job_id"] == job
    assert [j["job_id"] for j in json.loads(answers[1][2])["jobs"]] == [job]
    assert json.loads(answers[2][2])["ready"] is True
    routes = [r.mortred_route for r in port.finished]
    assert routes == ["jobs_submit", "jobs_status", "jobs_list", "ready"]
    assert port.port_app.active_requests == 0


def test_unknown_paths_wrong_methods_and_bad_encodings() -> None:
    """404 and 405 (with ``Allow``) come from the app's own error handlers; a path
    that is not UTF-8 once unquoted is a 400, as on Klein."""
    port = Port()
    [(code, _h, body)] = port.exchange(get(b"/nope"))
    assert code == 404 and json.loads(body)["error"] == "not found: /nope"
    [(code, headers, _b)] = port.exchange(get(b"/jobs", method=b"PUT"))
    assert code == 405 and headers[b"allow"] == b"GET, HEAD, POST"
    [(code, _h, body)] = port.exchange(get(b"/%ff%fe"))
    assert code == 400 and body == b"Non-UTF-8 encoding in URL."


def test_head_answers_a_get_route_without_its_body() -> None:
    port = Port()
    proto, transport = port.connect()
    proto.dataReceived(get(b"/healthz", method=b"HEAD") + get(b"/healthz"))
    raw = transport.value()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 15" in head
    assert rest.startswith(b"HTTP/1.1 200")  # no body between the two answers
    assert responses(rest)[0][2] == b'{"status":"ok"}'


def test_head_writes_no_body_on_any_route() -> None:
    """HEAD on every GET rule of the route table (the job's event stream included,
    which ends once its head is sent), then a GET on the same connection: each HEAD
    answer is a head alone."""
    port = Port()
    [(_code, _h, body)] = port.exchange(post(b"/jobs", json.dumps({"images": [IMG]}).encode()))
    job = json.loads(body)["job_id"]
    rules = [r.rule for r in port.app.app.url_map.iter_rules() if "GET" in (r.methods or ())]
    assert "/jobs/<job_id>/events" in rules
    for rule in rules:
        path = rule.replace("<job_id>", job).encode()
        if path.endswith(b"/wait"):
            path += b"?timeout=0"  # a long poll would park the HEAD too
        proto, transport = port.connect()
        proto.dataReceived(get(path, method=b"HEAD") + get(b"/healthz"))
        port.clock.advance(0)
        head, _, rest = transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 "), (rule, head)
        assert rest.startswith(b"HTTP/1.1 200"), (rule, rest[:80])  # no body in between
        assert responses(rest)[0][2] == b'{"status":"ok"}'


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"PUT /jobs HTTP/1.1\r\nHost: m\r\nContent-Length: 5000\r\n\r\n", 405, 62),
        (b"POST /jobs HTTP/1.1\r\nHost: m\r\nContent-Length: 5000\r\n\r\n", 401, None),
        (b"POST /jobs HTTP/1.1\r\nHost: m\r\n" + AUTH + b"Content-Length: 5000\r\n\r\n", 415, None),
        (b"POST /jobs HTTP/1.1\r\nHost: m\r\n" + AUTH
         + b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n", 413, None),
    ],
    ids=["405", "401", "415", "413"],
)  # fmt: skip
def test_a_body_over_the_limit_is_refused_in_the_pre_check_order(
    raw: bytes, status: int, code: int | None
) -> None:
    """A declared body over ``request_size_limit`` is answered from the head by the
    app's ``early_reject`` (405 → 401 → 415 → 413), with ``X-Request-ID``, and the
    connection closes without reading the body or running a route."""
    port = Port()
    proto, transport = port.connect()
    proto.dataReceived(raw)
    [(got, headers, body)] = responses(transport.value())
    assert got == status and headers[b"connection"] == b"close"
    assert headers[b"x-request-id"].startswith(b"req_")
    assert transport.disconnecting and port.finished == []
    if code is not None:
        assert json.loads(body)["code"] == code


def test_a_chunked_body_growing_over_the_limit_is_413() -> None:
    port = Port()
    proto, transport = port.connect()
    proto.dataReceived(
        b"POST /jobs HTTP/1.1\r\nHost: m\r\n" + AUTH + b"X-Request-ID: mine\r\n"
        + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"400\r\n" + b"x" * 0x400 + b"\r\n400\r\n" + b"x" * 0x400 + b"\r\n"
    )  # fmt: skip
    [(status, headers, _body)] = responses(transport.value())
    assert status == 413 and headers[b"x-request-id"] == b"mine"
    assert transport.disconnecting


@pytest.mark.parametrize(
    ("raw", "rid"),
    [
        (b"GET /healthz HTTP/1.1\r\nX-Request-ID: \xe2\x98\x83\r\n\r\n", b"%E2%98%83"),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Request-ID: two-hosts\r\n\r\n",
         b"two-hosts"),
        (b"GET /heal\x00thz HTTP/1.1\r\n\r\n", None),
    ],
    ids=["no-host-snowman-id", "two-hosts", "nul-in-target"],
)  # fmt: skip
def test_refusals_are_json_with_a_safe_request_id(raw: bytes, rid: bytes | None) -> None:
    """A refused head gets ``{"error": …}``, the client's ``X-Request-ID`` made safe
    (or a fresh one when none was read), and ``Connection: close``."""
    port = Port()
    [(status, headers, body)] = port.exchange(raw)
    assert status == 400 and "error" in json.loads(body)
    assert headers[b"x-request-id"] == rid if rid else headers[b"x-request-id"].startswith(b"req_")
    assert headers[b"connection"] == b"close"


def test_a_parked_wait_is_in_flight_until_answered_and_a_gone_client_cancels_it() -> None:
    """``when_idle`` waits for a parked ``/wait``; a client that goes away cancels
    it (its counter is released) and the port is idle again."""
    port = Port()
    proto, transport = port.connect()
    proto.dataReceived(post(b"/jobs", json.dumps({"images": [IMG]}).encode()))
    job = json.loads(responses(transport.value())[0][2])["job_id"]
    transport.clear()
    proto.dataReceived(get(f"/jobs/{job}/wait?timeout=60000".encode()))
    assert transport.value() == b"" and port.port_app.active_requests == 1
    idle = port.factory.when_idle()
    assert not idle.called
    waiters = len(port.app.runtime.counters)
    assert waiters >= 1
    proto.connectionLost(None)
    assert idle.called and port.port_app.active_requests == 0
    assert len(port.app.runtime.counters) == waiters - 1


def test_a_read_deadline_is_a_408_and_no_deadline_means_none() -> None:
    port = Port(request_read_timeout=2000)
    proto, transport = port.connect()
    proto.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: m\r\n")
    port.clock.advance(3.0)
    [(status, headers, _body)] = responses(transport.value())
    assert status == 408 and headers[b"connection"] == b"close"
    quiet = Port(request_read_timeout=0, peer_resp_timeout=0)
    assert quiet.factory._sweeper is None  # no deadline: no sweep at all
    proto, transport = quiet.connect()
    proto.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: m\r\n")
    quiet.clock.advance(3600.0)
    assert transport.value() == b"" and not transport.disconnecting


def test_an_idle_connection_is_closed_and_aborted_if_its_answer_stays_unread() -> None:
    """``peer_resp_timeout``: a connection silent that long between requests is
    closed; one whose client does not read the close is aborted 15 s later."""
    port = Port(peer_resp_timeout=10)
    proto, transport = port.connect()
    proto.dataReceived(get(b"/healthz"))
    assert responses(transport.value())[0][0] == 200
    port.clock.advance(9.0)
    assert not transport.disconnecting
    port.clock.advance(3.0)
    assert transport.disconnecting and not transport.disconnected
    port.clock.advance(15.0)
    assert transport.disconnected  # aborted: the peer never took the close
