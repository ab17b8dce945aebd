"""The model server's Klein routes in memory: StubTreq, task.Clock, hand-stepped threads."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.support.memory_http import MemoryClient

IMG = base64.b64encode(b"pixels").decode()


def make_app(
    rate_limiter: RateLimiter | None = None, **server: Any
) -> tuple[ModelServerApp, Clock, HandThreads, MemoryClient]:
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
    return app, clock, threads, MemoryClient(ModelPortFactory.for_app(app, clock))


def call(
    stub: MemoryClient,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    kwargs: dict[str, Any] = {"headers": dict(headers or {})}
    if body is not None:
        kwargs["data"] = json.dumps(body).encode()
        kwargs["headers"]["Content-Type"] = "application/json"
    d = stub.request(method, "http://localhost" + url, **kwargs)
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
    d = stub.get(f"http://localhost/jobs/{job}/wait?timeout=60000")
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
    d = stub.get(f"http://localhost/jobs/{doc['job_id']}/wait?timeout=250")
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
    d = stub.get(f"http://localhost/jobs/{job}/wait?timeout=60000")
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
        "http://localhost/infer", data=json.dumps({"images": [IMG]}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    stub.flush()
    second = stub.post(
        "http://localhost/infer", data=json.dumps({"images": [IMG]}).encode(),
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
    stub = MemoryClient(ModelPortFactory.for_app(ModelServerApp(runtime), clock))
    code, _h, ready = call(stub, "GET", "/ready")
    assert code == 503 and ready["code"] == 65 and "weights missing" in ready["error"]
    code, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    assert code == 503 and doc["code"] == 65


def test_status_body_is_valid_json_for_any_error_and_request_id() -> None:
    """The hand-assembled status answer escapes free text exactly as json.dumps does."""
    from mortred_twisted.jobs.states import JobState
    from mortred_twisted.jobs.status import status_body
    from mortred_twisted.jobs.types import JobSnapshot

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
    doc = json.loads(status_body(snap))
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
