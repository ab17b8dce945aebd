"""The Twisted client (treq, Deferreds) against a real model server on 127.0.0.1, on
the global reactor (pytest-twisted): the same surface as the sync client, and the
same fault handling through the proxy (lost submit answer, reset GETs, dropped
event stream)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import pytest_twisted
from mortred_client import JobFailed, JobNotFound
from mortred_client.twisted import TwistedClient
from twisted.internet import reactor

from tests.support.servers import RunningServer, model_server

from .proxy import FaultProxy, fault_proxy

CONF = "conf/server/fake/fake_async.toml"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with model_server(CONF, env={"MORTRED_ASYNC_MAX_QUEUE": "64"}) as srv:
        yield srv


@pytest.fixture()
def proxy(server: RunningServer) -> Iterator[FaultProxy]:
    with fault_proxy(server.port) as p:
        yield p


def client(base_url: str) -> TwistedClient:
    return TwistedClient(base_url, reactor=reactor)


@pytest_twisted.ensureDeferred
async def test_submit_wait_result_infer(server: RunningServer) -> None:
    """submit, wait, result, run, infer and queue fire with the same values as the
    sync client's."""
    c = client(server.base_url)
    job = await c.submit([b"x"], {"delay_ms": 50, "steps": 2}, req_id="tx-1")
    assert job.state == "pending" and job.poll_url == f"/jobs/{job.job_id}"
    assert (await job.wait(timeout=30)).state == "done"
    result = await job.result()
    assert result.code == 0 and result.req_id == "tx-1"
    assert (await c.run([b"x"], {"delay_ms": 1})).code == 0
    assert (await c.infer([b"x"], {"delay_ms": 1})).msg == "success"
    assert (await c.queue())["depth"] == 0
    with pytest.raises(JobNotFound):
        await c.job("job_00000000000000000000dead").status()


@pytest_twisted.ensureDeferred
async def test_events_cancel_and_listing(server: RunningServer) -> None:
    """async for over events() sees the job run; cancel() stops it; the stream ends
    with the cancelled event; result() fails with JobFailed; jobs() lists every page."""
    c = client(server.base_url)
    job = await c.submit([b"x"], {"delay_ms": 60000, "steps": 120})
    names = []
    async for event in job.events():
        names.append(event.name)
        if event.status.state == "running" and not event.status.cancel_requested:
            await job.cancel()
    assert names[-1] == "cancelled" and job.state == "cancelled"
    with pytest.raises(JobFailed):
        await job.result()
    tag = f"tx-page-{uuid.uuid4().hex[:6]}"
    ids = [(await c.submit([b"x"], {"delay_ms": 1}, req_id=tag)).job_id for _ in range(3)]
    assert [j.job_id for j in await c.jobs(page_size=2) if j.req_id == tag] == ids[::-1]


@pytest_twisted.ensureDeferred
async def test_faults_through_the_proxy(server: RunningServer, proxy: FaultProxy) -> None:
    """A lost submit answer is replayed (one job); reset GETs are retried; a cut event
    stream resumes with Last-Event-ID to the terminal event."""
    c = client(proxy.base_url)
    tag = f"tx-lost-{uuid.uuid4().hex[:6]}"
    proxy.faults = ["drop_answer"]
    job = await c.submit([b"x"], {"delay_ms": 1500, "steps": 6}, req_id=tag)
    assert job.replayed
    direct = client(server.base_url)
    assert [j.job_id for j in await direct.jobs() if j.req_id == tag] == [job.job_id]
    proxy.faults = ["reset", "reset"]
    assert (await job.status()).job_id == job.job_id
    proxy.faults = [("cut_after_events", 2)]
    seen = []
    final = await job.follow(seen.append)
    assert final.state == "done" and seen[-1].name == "done"
    streams = [r for r in proxy.requests if b"/events " in r.split(b"\r\n")[0]]
    assert len(streams) >= 2 and b"last-event-id: 2" in streams[1].lower()
