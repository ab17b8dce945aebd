"""The model server's Klein routes in memory: StubTreq, task.Clock, hand-stepped threads."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads

IMG = base64.b64encode(b"pixels").decode()


def make_app(
    rate_limiter: RateLimiter | None = None, **server: Any
) -> tuple[ModelServerApp, Clock, HandThreads, StubTreq]:
    doc = {
        "server": {"id": "T", "server_uri": "/infer", "worker_nums": 1, "async_enabled": True,
                   **server},
        "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1},
    }  # fmt: skip
    config = build_server_config(doc, env={})
    clock, threads = Clock(), HandThreads()
    runtime = ModelRuntime(
        config, clock=clock, threads=threads, metrics=ServerMetrics(),
        build_model=lambda _t, options, root: create_fake(options, root),
    )  # fmt: skip
    runtime.load_models()
    threads.step()
    app = ModelServerApp(runtime, rate_limiter=rate_limiter)
    return app, clock, threads, StubTreq(app.resource())


def call(
    stub: StubTreq,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    kwargs: dict[str, Any] = {"headers": dict(headers or {})}
    if body is not None:
        kwargs["data"] = json.dumps(body).encode()
        kwargs["headers"]["Content-Type"] = "application/json"
    d = stub.request(method, "http://x" + url, **kwargs)
    stub.flush()
    responses: list = []
    d.addCallback(responses.append)
    assert responses, f"{method} {url} did not answer"
    resp = responses[0]
    content: list = []
    resp.content().addCallback(content.append)
    stub.flush()
    raw = content[0]
    return resp.code, resp.headers, json.loads(raw) if raw else None


def test_202_is_sent_before_the_job_series_starts() -> None:
    """The 202 is complete while the runner has not yet touched the model (two turns later)."""
    app, clock, threads, stub = make_app()
    code, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    assert code == 202 and threads.pending == 0
    assert app.runtime.ledger.state(doc["job_id"]).value == "pending"
    clock.advance(0)  # (task.Clock runs both reactor hops in one advance)
    assert threads.pending == 1  # now the model call is queued on the pool
    threads.step()
    code, _h, status = call(stub, "GET", f"/jobs/{doc['job_id']}")
    assert status["state"] == "done"


def test_wait_parks_on_the_counter_and_wakes_on_terminal() -> None:
    """A wait registers one counter, and is answered when the job finishes."""
    app, clock, threads, stub = make_app()
    _c, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    job = doc["job_id"]
    d = stub.get(f"http://x/jobs/{job}/wait?timeout=60000")
    stub.flush()
    assert app.runtime.counters.waiting(job) == 1
    got: list = []
    d.addCallback(got.append)
    assert got == []
    clock.advance(0)
    clock.advance(0)
    threads.step()
    stub.flush()
    assert got and got[0].code == 200
    assert app.runtime.counters.waiting(job) == 0


def test_wait_budget_expiry_answers_with_the_current_state() -> None:
    """When the wait budget ends first, the answer carries the non-terminal state."""
    app, clock, _threads, stub = make_app()
    _c, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    d = stub.get(f"http://x/jobs/{doc['job_id']}/wait?timeout=250")
    stub.flush()
    got: list = []
    d.addCallback(got.append)
    clock.advance(0.2)
    stub.flush()
    assert got == []
    clock.advance(0.06)
    stub.flush()
    assert got and got[0].code == 200
    assert app.runtime.counters.waiting(doc["job_id"]) == 0


def test_client_disconnect_during_wait_removes_the_waiter() -> None:
    """A waiter whose client goes away leaves the counter and cancels its timer."""
    app, clock, _threads, stub = make_app()
    _c, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    job = doc["job_id"]
    d = stub.get(f"http://x/jobs/{job}/wait?timeout=60000")
    stub.flush()
    assert app.runtime.counters.waiting(job) == 1
    d.addErrback(lambda f: None)
    d.cancel()
    stub.flush()
    assert app.runtime.counters.waiting(job) == 0
    assert len(app.runtime.counters) == 0
    timers = [c for c in clock.getDelayedCalls() if c.getTime() > 30]
    assert timers == [], "the wait's budget timer was left behind"


def test_async_max_queue_zero_admits_nothing() -> None:
    """async_max_queue = 0 answers every submit with 429."""
    _app, _clock, _threads, stub = make_app(async_max_queue=0)
    code, headers, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    assert code == 429 and doc["error"] == "async queue full (max 0)"
    assert headers.getRawHeaders("retry-after") == ["1"]


def test_sync_request_cancelled_while_queued_leaves_the_queue() -> None:
    """A sync request whose client leaves while waiting for a worker is not run."""
    app, _clock, threads, stub = make_app()
    first = stub.post(
        "http://x/infer", data=json.dumps({"images": [IMG]}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    stub.flush()
    second = stub.post(
        "http://x/infer", data=json.dumps({"images": [IMG]}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    stub.flush()
    workers = app.runtime.workers
    assert workers.waiting("sync") == 1
    second.addErrback(lambda f: None)
    second.cancel()
    stub.flush()
    assert workers.waiting("sync") == 0
    threads.step()  # the first request's model call
    stub.flush()
    assert threads.pending == 0, "the cancelled request must not reach the model"
    assert workers.available == 1
    first.addErrback(lambda f: None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"images": "x"}, "images"),
        ({"images": [IMG], "params": {"delay_ms": -1}}, "params.delay_ms"),
        ({"images": [IMG], "params": {"mode": "warp"}}, "params.mode"),
        ({"images": [IMG], "req_id": 7}, "req_id"),
        ([1, 2], "body"),
    ],
)
def test_invalid_envelopes_are_422_naming_the_field(body: Any, field: str) -> None:
    """Envelope and params problems are 422 code 52 with the field in the message."""
    _app, _clock, _threads, stub = make_app()
    code, _h, doc = call(stub, "POST", "/infer", body)
    assert code == 422 and doc["code"] == 52 and field in doc["msg"]


def test_not_ready_server_answers_503() -> None:
    """A model that failed to load leaves /ready and POSTs at 503 code 65."""
    doc = {"server": {"id": "T", "async_enabled": True}, "model": {"type": "fake"}}
    config = build_server_config(doc, env={})
    clock, threads = Clock(), HandThreads()

    def broken(_t: str, _o: Any, _r: Any):
        raise RuntimeError("weights missing: /nowhere.pt")

    runtime = ModelRuntime(config, clock=clock, threads=threads, build_model=broken)
    runtime.load_models()
    threads.step()
    stub = StubTreq(ModelServerApp(runtime).resource())
    code, _h, ready = call(stub, "GET", "/ready")
    assert code == 503 and ready["code"] == 65 and "weights missing" in ready["error"]
    code, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    assert code == 503 and doc["code"] == 65


def test_fast_routes_and_klein_answer_identically() -> None:
    """The hand-dispatched hot routes give the same status, headers and body as Klein's
    routing."""
    app, clock, threads, fast = make_app()
    klein = StubTreq(app.klein_resource())
    _c, _h, doc = call(fast, "POST", "/jobs", {"images": [IMG], "req_id": "same"})
    job = doc["job_id"]
    clock.advance(0)
    threads.step()
    for method, url, body in [
        ("GET", f"/jobs/{job}", None),
        ("GET", f"/jobs/{job}/wait?timeout=5", None),
        ("GET", f"/jobs/{job}/result", None),
        ("GET", "/jobs/job_nope", None),
        ("GET", "/jobs/job_nope/result", None),
        ("GET", f"/jobs/{job}/wait?timeout=-3", None),
        ("POST", "/infer", {"images": []}),
        ("POST", "/jobs", {"nope": 1}),
    ]:
        rid = {"X-Request-ID": "eq-1"}
        fast_answer = call(fast, method, url, body, rid)
        klein_answer = call(klein, method, url, body, rid)
        assert fast_answer[0] == klein_answer[0], url
        assert fast_answer[2] == klein_answer[2], url
        fast_headers = dict(fast_answer[1].getAllRawHeaders())
        klein_headers = dict(klein_answer[1].getAllRawHeaders())
        fast_headers.pop(b"Date"), klein_headers.pop(b"Date")
        assert fast_headers == klein_headers, url


def _answer(stub: StubTreq, method: str, url: str, body: Any = None) -> Deferred:
    """Start one request; its Deferred fires with ``(status, raw headers, body bytes)``."""
    kwargs: dict[str, Any] = {"headers": {"X-Request-ID": "eq-2"}}
    if body is not None:
        kwargs["data"] = json.dumps(body).encode()
        kwargs["headers"]["Content-Type"] = "application/json"

    async def answer() -> tuple[int, dict[bytes, list[bytes]], bytes]:
        resp = await stub.request(method, "http://x" + url, **kwargs)
        raw = await resp.content()
        headers = dict(resp.headers.getAllRawHeaders())
        # Allowed to differ: the time of day, and the model's measured run time.
        headers.pop(b"Date")
        if b"Server-Timing" in headers:
            [timing] = headers.pop(b"Server-Timing")
            headers[b"Server-Timing"] = [timing.split(b"=")[0]]
        return resp.code, headers, raw

    return Deferred.fromCoroutine(answer())


def _settle(
    stubs: tuple[StubTreq, ...], clock: Clock, threads: HandThreads, *pending: Deferred
) -> list:
    """Turn the reactor and the hand-stepped pool until every request has answered."""
    answers: list = [None] * len(pending)
    for i, d in enumerate(pending):
        d.addCallback(lambda answer, i=i: answers.__setitem__(i, answer))
    for _ in range(50):
        for stub in stubs:
            stub.flush()
        clock.advance(0)
        if all(a is not None for a in answers):
            return answers
        if threads.pending:
            threads.step()
    raise AssertionError(f"requests did not answer: {answers}")


def test_fast_routes_and_klein_agree_on_202_infer_and_a_parked_wait() -> None:
    """Submitting, a sync infer and a wait that parks until the job ends answer alike
    through both dispatchers: status, body and every header (Date and the measured
    Server-Timing duration aside)."""
    app, clock, threads, fast = make_app()
    klein = StubTreq(app.klein_resource())
    both = (fast, klein)
    env = {"images": [IMG], "req_id": "same"}
    submits = _settle(both, clock, threads,
                      _answer(fast, "POST", "/jobs", env),
                      _answer(klein, "POST", "/jobs", env))  # fmt: skip
    ids = [json.loads(raw)["job_id"] for _c, _h, raw in submits]
    assert [code for code, _h, _b in submits] == [202, 202]

    def normal(answer: tuple[int, dict[bytes, list[bytes]], bytes], job: str) -> tuple:
        code, headers, raw = answer
        fix = {k: [v.replace(job.encode(), b"JOB") for v in vs] for k, vs in headers.items()}
        return code, fix, raw.replace(job.encode(), b"JOB")

    assert normal(submits[0], ids[0]) == normal(submits[1], ids[1])
    # Both waits park (the job is still pending), then answer when it ends.
    waits = [_answer(stub, "GET", f"/jobs/{ids[0]}/wait?timeout=60000")
             for stub in both]  # fmt: skip
    fast.flush(), klein.flush()
    assert not any(d.called for d in waits), "the wait answered before the job ended"
    parked = _settle(both, clock, threads, *waits)
    assert json.loads(parked[0][2])["state"] == "done"
    assert parked[0] == parked[1]
    infers = _settle(both, clock, threads,
                     _answer(fast, "POST", "/infer", env),
                     _answer(klein, "POST", "/infer", env))  # fmt: skip
    assert infers[0][0] == 200 and infers[0] == infers[1]


def test_status_body_is_valid_json_for_any_error_and_request_id() -> None:
    """The hand-assembled status answer escapes free text exactly as json.dumps does."""
    from mortred_twisted.jobs.ledger import JobSnapshot
    from mortred_twisted.jobs.states import JobState

    snap = JobSnapshot(
        job_id="job_00ff",
        state=JobState.FAILED,
        task_id='req "quoted" \\ back\nslash ☃',
        elapsed_ms=12,
        error='ValueError: bad "pixels"\n\ttab \u2028',
        progress=(3, 7),
        queued_ms=1,
        completed_unix=1764500000.123456,
    )
    doc = json.loads(ModelServerApp._status_body(snap))
    assert doc == {
        "job_id": "job_00ff",
        "state": "failed",
        "elapsed_ms": 12,
        "error": snap.error,
        "progress": {"step": 3, "total": 7},
        "queued_ms": 1,
        "completed_at": 1764500000.123456,
        "req_id": snap.task_id,
        "poll_url": "/jobs/job_00ff",
        "result_url": "/jobs/job_00ff/result",
    }
