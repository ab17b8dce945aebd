"""Job ids are per caller (issue 17 § 4): on a model port with a token, a job belongs
to the ``X-Mortred-Principal`` that submitted it, and every job route answers another
caller's job exactly as an unknown id."""

from __future__ import annotations

from typing import Any

import pytest

from tests.http.test_model_server_app import IMG, call, make_app

TOKEN = "internal"


def as_caller(name: str | None, scope_all: bool = False) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if name is not None:
        headers["X-Mortred-Principal"] = name
    if scope_all:
        headers["X-Mortred-Principal-Scope"] = "all"
    return headers


def submitted(stub: Any) -> str:
    status, _, doc = call(stub, "POST", "/jobs", {"images": [IMG]}, as_caller("key:alice"))
    assert status == 202
    return str(doc["job_id"])


ROUTES = [
    ("GET", "/jobs/{id}"),
    ("GET", "/jobs/{id}/wait?timeout=0"),
    ("GET", "/jobs/{id}/result"),
    ("GET", "/jobs/{id}/events"),
    ("DELETE", "/jobs/{id}"),
]


@pytest.mark.parametrize(("method", "route"), ROUTES)
def test_another_callers_job_is_answered_as_an_unknown_id(method: str, route: str) -> None:
    """Bob gets, for Alice's job, the very status and body an unknown id gets (only
    the id in the message differs), and a DELETE leaves her job alone."""
    app, _clock, _threads, stub = make_app(auth_token=TOKEN, worker_nums=1)
    job = submitted(stub)
    status, _, body = call(stub, method, route.format(id=job), headers=as_caller("key:bob"))
    unknown = "job_" + "0" * 24
    status_u, _, body_u = call(stub, method, route.format(id=unknown), headers=as_caller("key:bob"))
    assert (status, status_u) == (404, 404)
    assert body["code"] == body_u["code"] and body["error"].replace(job, unknown) == body_u["error"]
    snap = app.runtime.store.snapshot(job)
    assert snap is not None and not snap.cancel_requested and snap.state.value != "cancelled"


@pytest.mark.parametrize("who", [as_caller("key:alice"), as_caller("key:ops", scope_all=True),
                                 as_caller(None)])  # fmt: skip
def test_the_owner_an_all_scope_caller_and_the_port_token_see_the_job(who: dict[str, str]) -> None:
    _app, _clock, _threads, stub = make_app(auth_token=TOKEN, worker_nums=1)
    job = submitted(stub)
    status, _, doc = call(stub, "GET", f"/jobs/{job}", headers=who)
    assert status == 200 and doc["job_id"] == job
    status, _, _ = call(stub, "DELETE", f"/jobs/{job}", headers=who)
    assert status in (200, 202)


@pytest.mark.parametrize("host", ["evil.example", "127.0.0.1.nip.io:8080", "10.0.0.7", None])
def test_a_port_without_a_token_answers_only_loopback_host_names(host: str | None) -> None:
    """DNS rebinding: a model port without a token answers 421 to a Host that is not a
    loopback name (GET or POST, before any body byte), and serves localhost."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from mortred_twisted.http.model_port import ModelPortFactory
    from tests.http11.test_server import responses
    from tests.support.memory_http import MemoryClient

    app, _clock, _threads, client = make_app(worker_nums=1)
    factory = ModelPortFactory.for_app(app, Clock())
    line = b"" if host is None else b"Host: " + host.encode() + b"\r\n"
    for raw in (b"GET /healthz HTTP/1.0\r\n" + line + b"\r\n",
                b"POST /jobs HTTP/1.0\r\n" + line + b"Content-Length: 900\r\n\r\n"):  # fmt: skip
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(raw)
        (status, headers, body), *_ = responses(transport.value())
        assert status == 421 and b"loopback" in body
        assert headers[b"x-content-type-options"] == b"nosniff"
    assert isinstance(client, MemoryClient)
    d = client.get("http://localhost:8080/healthz")
    client.flush()
    assert d.result.code == 200
