"""The job-API routes in memory: event streams on a task.Clock (heartbeat, wake-ups from
named counters, cleanup when the client leaves) and cancel's effect on the runner."""

from __future__ import annotations

from typing import Any

from twisted.web.test.requesthelper import DummyRequest

from mortred_twisted.jobs.states import JobState
from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.runtime.job_events import events_counter
from tests.http.test_model_server_app import make_app


def stream(app: Any, job_id: str) -> tuple[DummyRequest, Any]:
    request = DummyRequest([b"jobs", job_id.encode(), b"events"])
    request.method = b"GET"
    outcome = app.jobs.events.job_events(request, job_id)
    return request, outcome


def records(request: DummyRequest) -> list[bytes]:
    return [r for r in b"".join(request.written).split(b"\n\n") if r]


def admit(app: Any) -> str:
    job = app.runtime.store.submit(InferenceRequest(req_id="r", images=(b"x",)), "r")
    app.runtime.runner.start(job)
    return job


def test_stream_sends_the_state_then_pings_while_idle_and_wakes_on_changes() -> None:
    """A pending job's stream has its state at once, a ': ping' every 15 s of quiet, a
    state event when the job runs and the terminal event, then it ends."""
    app, clock, threads, _stub = make_app(worker_nums=1)
    blocker = admit(app)  # takes the only worker
    clock.advance(0)
    job = admit(app)
    request, outcome = stream(app, job)
    first = records(request)
    assert first[0].startswith(b"retry:") and b"event: state" in first[1]
    assert b'"queue_position":1' in first[1]
    clock.advance(15)
    assert records(request)[-1] == b": ping"
    assert app.runtime.counters.waiting(events_counter(job)) == 1
    threads.step()  # the blocker finishes; the job takes the worker
    clock.advance(0)
    assert b'"state":"running"' in records(request)[-1]
    threads.step()  # the job finishes
    clock.advance(0)
    last = records(request)[-1]
    assert last.startswith(b"id: 4\nevent: done")
    assert outcome.called and app.runtime.counters.waiting(events_counter(job)) == 0
    assert app.runtime.store.ledger.state(blocker) is JobState.DONE


def test_a_client_that_leaves_removes_its_counter_and_the_gauge() -> None:
    """Cancelling the stream (what Klein does on disconnect) leaves nothing behind."""
    app, clock, _threads, _stub = make_app(worker_nums=1)
    admit(app)
    clock.advance(0)
    job = admit(app)
    clock.advance(0)
    _request, outcome = stream(app, job)
    metrics = app.runtime.metrics
    assert metrics.registry.get_sample_value("mortred_job_event_streams") == 1
    outcome.addErrback(lambda _f: None)
    outcome.cancel()
    assert app.runtime.counters.waiting(events_counter(job)) == 0
    assert metrics.registry.get_sample_value("mortred_job_event_streams") == 0
    # No heartbeat timer left either: what remains are the jobs' own 600 s budgets.
    assert all(c.getTime() - clock.seconds() > 100 for c in clock.getDelayedCalls())


def test_cancelling_a_pending_job_releases_its_place_in_the_worker_queue() -> None:
    """A pending job cancelled while its series waits for a worker never takes one: the
    next job gets the worker first."""
    app, clock, threads, _stub = make_app(worker_nums=1)
    running = admit(app)
    clock.advance(0)
    doomed, after = admit(app), admit(app)
    clock.advance(0)
    request = DummyRequest([b"jobs", doomed.encode()])
    request.method = b"DELETE"
    app.jobs.cancel_job(request, doomed)
    assert request.responseCode == 200
    assert app.runtime.store.ledger.state(doomed) is JobState.CANCELLED
    threads.step()  # the first job ends; the worker goes to `after`, not `doomed`
    clock.advance(0)
    assert app.runtime.store.ledger.state(after) is JobState.RUNNING
    assert app.runtime.store.ledger.state(running) is JobState.DONE
    assert app.runtime.workers.busy == 1


def test_a_stopping_server_parks_no_new_wait_and_ends_streams_with_the_current_state() -> None:
    """Once the runtime is stopping, /wait answers the job's current status at once
    and an event stream opened then ends after its first event."""
    from mortred_twisted.runtime.model_runtime import Readiness
    from tests.http.test_model_server_app import IMG, call

    app, _clock, _threads, stub = make_app(worker_nums=1)
    _c, _h, doc = call(stub, "POST", "/jobs", {"images": [IMG]})
    app.runtime.readiness = Readiness.STOPPING
    code, _h, status = call(stub, "GET", f"/jobs/{doc['job_id']}/wait?timeout=60000")
    assert code == 200 and status["state"] in ("pending", "running")
    assert app.runtime.counters.waiting(doc["job_id"]) == 0
    request, outcome = stream(app, doc["job_id"])
    assert outcome.called and b"event: state" in b"".join(request.written)


def test_ten_thousand_streams_dropped_mid_read_leave_no_counter() -> None:
    """Clients that leave while the stream re-reads the job (a shared store's read
    still on its way) take their wake counters with them: after 10,000 such streams
    on one job the registry and the streams gauge are back to zero."""
    from twisted.internet.defer import Deferred

    app, clock, _threads, _stub = make_app(worker_nums=1)
    admit(app)
    clock.advance(0)
    job = admit(app)
    clock.advance(0)
    rt = app.runtime
    real = rt.store.snapshot
    reads: list[Deferred[Any]] = []

    def slow_snapshot(job_id: str) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        reads.append(d)
        return d

    rt.store.snapshot = slow_snapshot
    for _ in range(10_000):
        reads.clear()
        _request, outcome = stream(app, job)
        reads.pop().callback(real(job))  # the first read: the stream starts
        assert len(reads) == 1  # the read after registering its counter, in flight
        outcome.addErrback(lambda _f: None)
        outcome.cancel()  # the client leaves mid-read
    assert rt.counters.waiting(events_counter(job)) == 0
    assert rt.counters.total_waiting == 0 and len(rt.counters) == 0
    assert rt.metrics.registry.get_sample_value("mortred_job_event_streams") == 0
