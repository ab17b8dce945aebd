"""The sync client against a real model server (``FAKE_ASYNC``) on 127.0.0.1, directly
and through a fault-injecting TCP proxy: submit, wait, result, cancel, events with a
dropped and resumed stream, listing across pages, infer; a lost submit answer makes
one job, not two; a 503 with Retry-After is waited out; reset connections are
retried (GETs) or not (sync inference)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pytest
from mortred_client import (
    Client,
    JobAlreadyFinished,
    JobFailed,
    JobNotFinished,
    JobNotFound,
    RetryPolicy,
    TransportError,
)

from tests.support.servers import RunningServer, model_server

from .proxy import FaultProxy, fault_proxy

CONF = "conf/server/fake/fake_async.toml"
#: 60 s in 120 steps: far from ending on its own, stops within 0.5 s of a cancel.
LONG = {"delay_ms": 60000, "steps": 120}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with model_server(CONF, env={"MORTRED_ASYNC_MAX_QUEUE": "64"}) as srv:
        yield srv


@pytest.fixture()
def proxy(server: RunningServer) -> Iterator[FaultProxy]:
    with fault_proxy(server.port) as p:
        yield p


def jobs_with(client: Client, req_id: str) -> list[str]:
    """Ids of the retained jobs submitted with ``req_id`` (the port sees every job)."""
    return [j.job_id for j in client.jobs() if j.req_id == req_id]


def test_submit_wait_result(server: RunningServer) -> None:
    """A job submitted on the model port is pending at once, done after wait(), and
    its result is the model's envelope (repeatable)."""
    client = Client(server.base_url)
    job = client.submit([b"pixels"], {"delay_ms": 50, "steps": 2}, req_id="e2e-1")
    assert job.state == "pending" and job.poll_url == f"/jobs/{job.job_id}"
    assert not job.replayed
    final = job.wait(timeout=30)
    assert final.state == "done" and final.terminal and final.elapsed_ms is not None
    result = job.result()
    assert result.code == 0 and result.req_id == "e2e-1" and result.data["params"]["steps"] == 2
    assert job.result() == result
    assert client.run([b"x"], {"delay_ms": 10}).code == 0


def test_queue_position_comes_with_a_status_not_with_the_submit(server: RunningServer) -> None:
    """Behind two running jobs (2 workers), a third is pending: its submit answer names
    no queue position (None, as docs/client.md says), its status does."""
    client = Client(server.base_url)
    jobs = [client.submit([b"x"], LONG) for _ in range(3)]
    try:
        last = jobs[-1]
        assert last.state == "pending" and last.queue_position is None
        status = last.status()
        assert status.state == "pending" and status.queue_position is not None
        assert status.queue_position >= 1 and last.queue_position == status.queue_position
    finally:
        for job in jobs:
            job.cancel()


def test_wait_timeout_returns_the_running_status(server: RunningServer) -> None:
    """wait(timeout) returns the job's non-terminal status when the caller's timeout
    passes first; result() then raises JobNotFinished."""
    client = Client(server.base_url)
    job = client.submit([b"x"], LONG)
    try:
        status = job.wait(timeout=0.3)
        assert status.state in ("pending", "running") and not status.terminal
        with pytest.raises(JobNotFinished):
            job.result()
    finally:
        job.cancel()


def test_cancel_and_failed_jobs(server: RunningServer) -> None:
    """cancel() of a running job asks it to stop; it ends cancelled, result() raises
    JobFailed, a second cancel JobAlreadyFinished; a failing job's result() raises
    JobFailed with the model's error; an unknown job is JobNotFound."""
    client = Client(server.base_url)
    job = client.submit([b"x"], LONG)
    for event in job.events():
        if event.status.state == "running":
            break
    status = job.cancel()
    assert status.cancel_requested or status.state == "cancelled"
    assert job.wait(timeout=30).state == "cancelled"
    with pytest.raises(JobFailed) as e:
        job.result()
    assert e.value.state == "cancelled"
    with pytest.raises(JobAlreadyFinished):
        job.cancel()
    failing = client.submit([b"x"], {"delay_ms": 10, "fail": True})
    with pytest.raises(JobFailed) as e:
        failing.result(wait=True, timeout=30)
    assert e.value.state == "failed" and "fake model failure" in (e.value.error or "")
    with pytest.raises(JobNotFound):
        client.job("job_00000000000000000000dead").status()


def test_events_follow_the_job_to_its_end(server: RunningServer) -> None:
    """events() yields the current state, progress steps and the terminal event."""
    job = Client(server.base_url).submit([b"x"], {"delay_ms": 300, "steps": 3})
    events = list(job.events())
    assert events[-1].name == "done" and events[-1].terminal
    assert any(e.name == "progress" for e in events)
    assert job.state == "done"


def test_a_dropped_event_stream_resumes_with_last_event_id(
    server: RunningServer, proxy: FaultProxy
) -> None:
    """The proxy cuts the stream after two events; the client reconnects with
    Last-Event-ID, skips the repeated state and still ends with the terminal event."""
    client = Client(proxy.base_url)
    job = client.submit([b"x"], {"delay_ms": 1500, "steps": 6})
    proxy.faults = [("cut_after_events", 2)]
    events = list(job.events())
    assert events[-1].name == "done"
    streams = [r for r in proxy.requests if b"/events " in r.split(b"\r\n")[0]]
    assert len(streams) >= 2, proxy.requests
    assert b"Last-Event-ID: " not in streams[0] and b"Last-Event-ID: 2" in streams[1]
    keys = [(e.status.state, e.status.progress) for e in events]
    assert all(a != b for a, b in itertools.pairwise(keys)), keys


def test_listing_iterates_over_every_page(server: RunningServer) -> None:
    """jobs() follows next_cursor: five jobs listed two per page all come back, newest
    first; list_jobs() gives one page with a cursor."""
    client = Client(server.base_url)
    tag = f"page-{uuid.uuid4().hex[:6]}"
    ids = [client.submit([b"x"], {"delay_ms": 1}, req_id=tag).job_id for _ in range(5)]
    page = client.list_jobs(limit=2)
    assert len(page.jobs) == 2 and page.next_cursor
    listed = [j.job_id for j in client.jobs(page_size=2) if j.req_id == tag]
    assert listed == ids[::-1]


def test_infer_on_the_sync_route(server: RunningServer) -> None:
    """infer() finds the port's sync route in /openapi.json and returns the envelope."""
    result = Client(server.base_url).infer([b"x"], {"delay_ms": 1}, req_id="sync-1")
    assert result.code == 0 and result.req_id == "sync-1" and result.msg == "success"


def test_queue_answers_the_models_queue(server: RunningServer) -> None:
    """queue() answers the model's GET /queue (depth, running, oldest wait, callers)."""
    queue = Client(server.base_url).queue()
    assert queue["depth"] == queue["pending"] + queue["running"]
    assert isinstance(queue["callers"], list)


def test_a_submit_whose_answer_is_lost_makes_exactly_one_job(
    server: RunningServer, proxy: FaultProxy
) -> None:
    """The proxy forwards the submit and drops the 202; the client resends it with the
    same Idempotency-Key and gets the first job back (replayed): one job exists."""
    client = Client(proxy.base_url)
    tag = f"lost-{uuid.uuid4().hex[:6]}"
    proxy.faults = ["drop_answer"]
    job = client.submit([b"x"], {"delay_ms": 10}, req_id=tag)
    assert job.replayed
    posts = [r for r in proxy.requests if r.startswith(b"POST /jobs ")]
    assert len(posts) == 2 and posts[0] == posts[1]
    assert jobs_with(Client(server.base_url), tag) == [job.job_id]


def test_a_503_with_retry_after_is_waited_out(server: RunningServer, proxy: FaultProxy) -> None:
    """The proxy answers 503 with Retry-After: 1 twice; the client waits 1 s each time
    (injected sleep) and then gets the real answer."""
    slept: list[float] = []
    client = Client(proxy.base_url, sleep=slept.append)
    job = client.submit([b"x"], {"delay_ms": 1})
    proxy.faults = [("status", 503, 1), ("status", 503, 1)]
    assert job.wait(timeout=30).state == "done"
    assert slept == [1.0, 1.0] and proxy.connections == 4


def test_reset_connections_are_retried_for_gets_only(
    server: RunningServer, proxy: FaultProxy
) -> None:
    """Two reset connections in a row are retried for a GET; a sync inference that
    meets a reset is not repeated (it may have run) and raises TransportError."""
    slept: list[float] = []
    client = Client(proxy.base_url, sleep=slept.append, infer_path="/mortred/fake/infer")
    job = client.submit([b"x"], {"delay_ms": 1})
    proxy.faults = ["reset", "reset"]
    assert job.status().job_id == job.job_id
    assert len(slept) == 2
    proxy.faults = ["reset"]
    before = proxy.connections
    with pytest.raises(TransportError):
        client.infer([b"x"], {"delay_ms": 1})
    assert proxy.connections == before + 1


def test_refused_connection_exhausts_the_policy() -> None:
    """Nothing listening: the client retries within its policy, then raises."""
    slept: list[float] = []
    client = Client("http://127.0.0.1:1", sleep=slept.append, retry=RetryPolicy(max_attempts=3))
    with pytest.raises(TransportError, match=r"127\.0\.0\.1:1\b"):
        client.job("job_1").status()
    assert len(slept) == 2
