"""The gateway's edge with admission at zero replicas (http/gateway.py ``_cold``): when
no replica of an autoscaled id takes a submit, the admission's answer is rendered
like an upstream's (public job URLs) and one wake starts a replica without holding
anything; when the admission cannot answer, the request is held as before."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from twisted.internet import defer
from twisted.web.http_headers import Headers

from mortred_twisted.config.catalog import Catalog
from mortred_twisted.config.control import AutoscaleSettings
from mortred_twisted.gateway.cold_start import ColdStart, Woken
from mortred_twisted.gateway.routing import RouteKind
from mortred_twisted.http.gateway_admission import LocalResponse

from .test_gateway_app import AUTH, Client, Harness

JOB = "/v1/models/ASYNC/jobs"
ADMITTED = json.dumps({"job_id": "job_z", "state": "pending", "poll_url": "/jobs/job_z",
                       "result_url": "/jobs/job_z/result"}).encode()  # fmt: skip


class FakeAdmission:
    """Answers with ``answer`` (a LocalResponse), or None at once / later."""

    def __init__(self, answer: LocalResponse | str) -> None:
        self.answer = answer
        self.seen: list[tuple[Any, dict[bytes, list[bytes]], bytes | None]] = []

    def serve(self, route: Any, headers: Any, data: Any) -> Any:
        self.seen.append((route, headers, data))
        if self.answer == "none-now":
            return None
        if self.answer == "none-later":
            return defer.succeed(None)
        return defer.succeed(self.answer)


def rig(answer: LocalResponse | str) -> tuple[Harness, FakeAdmission, list[Any]]:
    h = Harness(upstream="refuse")
    settings = AutoscaleSettings(min_replicas=0, max_replicas=1, cold_start_timeout_s=30)
    entry = replace(h.app.catalog["ASYNC"], autoscale=settings, job_store="redis")
    wakes: list[defer.Deferred[Woken]] = []

    def wake(_model_id: str) -> defer.Deferred[Woken]:
        d: defer.Deferred[Woken] = defer.Deferred()
        wakes.append(d)
        return d

    h.app.cold_start = ColdStart(Catalog([entry]), wake, h.clock)
    admission = FakeAdmission(answer)
    h.app.admission = admission
    return h, admission, wakes


def local(code: int, body: bytes, **headers: str) -> LocalResponse:
    raw = {b"content-type": [b"application/json; charset=utf-8"]}
    raw.update({k.replace("_", "-").encode(): [v.encode()] for k, v in headers.items()})
    return LocalResponse(code, Headers(raw), body)


def test_a_submit_at_zero_is_answered_by_the_admission_with_public_urls() -> None:
    """202 at once with the gateway's Location and URLs; the admission saw what the
    model would have (internal token, caller, Idempotency-Key, body); one wake is
    sent and nothing is held."""
    h, admission, wakes = rig(local(202, ADMITTED, location="/jobs/job_z"))
    response, body = h.call("POST", JOB, headers={**AUTH, "Idempotency-Key": "k"}, data=b"{}")
    assert response.code == 202
    assert response.headers.getRawHeaders("location") == [f"{JOB}/job_z"]
    assert json.loads(body)["poll_url"] == f"{JOB}/job_z"
    route, headers, data = admission.seen[-1]
    assert route.kind is RouteKind.SUBMIT and data == b"{}"
    assert headers[b"authorization"] == [b"Bearer internal"]
    assert headers[b"idempotency-key"] == [b"k"] and headers[b"x-mortred-principal"]
    cold = h.app.cold_start
    assert len(wakes) == 1 and cold.waiting["ASYNC"] == 0 and cold.admitted == 1
    h.app.metrics.watch_cold_start(cold)
    text = h.app.metrics.render().decode()
    assert 'mortred_gateway_cold_start_requests_total{outcome="admitted"} 1.0' in text
    assert 'mortred_gateway_cold_start_requests_total{outcome="held"} 0.0' in text


def test_one_wake_at_a_time_per_model_for_admitted_jobs() -> None:
    """Two submits admitted at zero send one wake; once it is answered, the next
    admitted submit sends another."""
    h, _admission, wakes = rig(local(202, ADMITTED, location="/jobs/job_z"))
    h.call("POST", JOB, headers=AUTH, data=b"{}")
    h.call("POST", JOB, headers=AUTH, data=b"{}")
    assert len(wakes) == 1
    wakes[0].callback(Woken("http://127.0.0.1:18100"))
    h.call("POST", JOB, headers=AUTH, data=b"{}")
    assert len(wakes) == 2 and h.app.cold_start.admitted == 3


def test_a_422_of_the_admission_passes_and_wakes_nothing() -> None:
    """The model's 422 (from its twin) reaches the client unchanged; no replica is
    woken for a job that was not admitted."""
    refusal = b'{"error":"params.times: must be <= 3","code":52}'
    h, _admission, wakes = rig(local(422, refusal))
    response, body = h.call("POST", JOB, headers=AUTH, data=b"{}")
    assert (response.code, body) == (422, refusal)
    assert wakes == [] and h.app.cold_start.admitted == 0


def test_without_an_answer_the_request_is_held_as_before() -> None:
    """No twin (None at once or after the read): the submit is held, counted as
    waiting, with its own wake."""
    for answer in ("none-now", "none-later"):
        h, admission, wakes = rig(answer)
        client = Client(h)
        client.send("POST", JOB, AUTH, b"{}")
        assert client.answer() is None  # held: no answer yet
        assert admission.seen and len(wakes) == 1
        assert h.app.cold_start.waiting["ASYNC"] == 1 and h.app.cold_start.held == 1


def test_after_a_wake_found_no_replica_submits_are_held_not_admitted() -> None:
    """The supervisor answered a wake without a replica (an operator's stop): the
    next submit is held (and refused as before), not admitted into a store no
    replica may read; once a wake finds a replica, submits are admitted again; a
    wake cancelled by a client that left marks nothing."""
    h, admission, wakes = rig(local(202, ADMITTED, location="/jobs/job_z"))
    h.call("POST", JOB, headers=AUTH, data=b"{}")
    wakes[0].callback(Woken(None))
    assert "ASYNC" in h.app.cold_start.unstartable
    served = len(admission.seen)
    client = Client(h)
    client.send("POST", JOB, AUTH, b"{}")
    assert client.answer() is None and len(admission.seen) == served  # held
    response, _ = h.call("GET", f"{JOB}/job_z", headers=AUTH)  # a poll: still from Redis
    assert response.code == 202 and len(admission.seen) == served + 1
    wakes[1].callback(Woken("http://127.0.0.1:18100"))
    assert "ASYNC" not in h.app.cold_start.unstartable
    h.app.cold_start.hold(admission.seen[0][0], lambda r: defer.succeed(b""), None).cancel()
    assert "ASYNC" not in h.app.cold_start.unstartable
