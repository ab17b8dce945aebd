# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""The Redis store when messages are lost, late or never sent (issue 18, items 1 and 4):
the cancel flag in the job's hash is read at claim, at every lease renewal and at
every progress write; progress writes are coalesced and published only while
followed; a failed hand-back stops the lease renewals; listings scan a bounded
number of entries per call and say where to go on.

Against a real ``redis-server`` (tests/support/redis_server.py). A "lost message" is
made by writing the flag straight into Redis (``HSET … cancel 1``), which is what a
``CANCEL`` does minus the announcement.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.store import StoreUnavailable
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.stores.redis_scripts import LIST_SCAN, key_prefix
from tests.stores.test_store_contract import (  # noqa: F401
    REQ,
    Replicas,
    eventually,
    redis,
    redis_store,
)
from tests.support.redis_server import RedisServer


@pytest.fixture
def model_id() -> str:
    return "C" + uuid.uuid4().hex[:8]


@pytest_twisted.async_yield_fixture
async def stores(redis: RedisServer, model_id: str) -> AsyncIterator[Replicas]:
    made = Replicas(redis.url, model_id)
    yield made
    await made.stop_all()


def flag(redis: RedisServer, model_id: str, job: str) -> None:
    """Accept a cancel without announcing it (the announcement was lost)."""
    redis.command("HSET", f"{key_prefix(model_id)}job:{job}", "cancel", "1")


async def turn() -> None:
    await deferLater(reactor, 0, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_cancel_whose_message_was_lost_is_read_at_the_lease_renewal(
    redis: RedisServer, model_id: str, stores: Callable[..., Any]
) -> None:
    """The replica running a job never heard the cancel: its next lease renewal reads
    the flag and stops the run."""
    a = await stores()
    told: list[str] = []
    a.on_cancel = told.append
    job = await a.submit(REQ)
    await a.claim_next()
    flag(redis, model_id, job)
    assert told == []
    await a.maintain()
    assert told == [job]


@pytest_twisted.ensureDeferred
async def test_a_cancel_whose_message_was_lost_is_read_at_the_next_progress_write(
    redis: RedisServer, model_id: str, stores: Callable[..., Any]
) -> None:
    """A step boundary's progress write brings the flag back: the run stops at once,
    without waiting for a lease renewal."""
    a = await stores()
    told: list[str] = []
    a.on_cancel = told.append
    job = await a.submit(REQ)
    await a.claim_next()
    flag(redis, model_id, job)
    a.set_progress(job, 1, 10)

    async def stopped() -> bool:
        return told == [job]

    await eventually(stopped, "the progress write to read the flag")


@pytest_twisted.ensureDeferred
async def test_a_cancel_announced_before_the_claims_reply_still_stops_the_job(
    stores: Callable[..., Any],
) -> None:
    """The ``c`` message arrives before the reply of the claim that took the job (two
    connections, no order between them): it is remembered and applied to the claim."""
    a = await stores()
    told: list[str] = []
    a.on_cancel = told.append
    job = await a.submit(REQ)
    a._on_event(b"c " + job.encode())  # the announcement, ahead of the claim
    claim = await a.claim_next()
    assert claim.job_id == job and told == []
    for _ in range(500):  # applied once the claim's reply has unwound (a bounded wait)
        if told:
            break
        await deferLater(reactor, 0.002, lambda: None)
    assert told == [job]


@pytest_twisted.ensureDeferred
async def test_a_cancelled_job_that_finishes_first_never_ends_done(
    stores: Callable[..., Any],
) -> None:
    """A run that comes back with a result after its cancel was accepted ends
    cancelled; the result is dropped."""
    a, b = await stores(), await stores()
    job = await a.submit(REQ)
    await a.claim_next()
    assert (await b.cancel(job))[0] is CancelOutcome.REQUESTED
    assert await a.terminate(job, JobState.DONE, result=b'{"late": 1}')
    snap = await b.snapshot(job)
    assert snap.state is JobState.CANCELLED
    assert not (await b.take_result(job)).done


@pytest.mark.parametrize("attempts_left", [True, False], ids=["attempts-left", "attempts-used"])
@pytest_twisted.ensureDeferred
async def test_a_cancelled_job_of_a_lost_replica_ends_cancelled(
    stores: Callable[..., Any], attempts_left: bool
) -> None:
    """The replica running a cancelled job died: when its lease expires the job ends
    cancelled (not re-run, not failed), whether attempts were left or used up."""
    lost = await stores(lease_ms=300, max_attempts=2 if attempts_left else 1)
    other = await stores(lease_ms=300, max_attempts=2 if attempts_left else 1)
    job = await other.submit(REQ)
    await lost.claim_next()
    lost._held.clear()  # it dies: no more renewals
    assert (await other.cancel(job))[0] is CancelOutcome.REQUESTED

    async def ended() -> bool:
        await other.maintain()
        return (await other.snapshot(job)).terminal

    await eventually(ended, "the expired lease to end the job")
    assert (await other.snapshot(job)).state is JobState.CANCELLED
    assert other.queue_depth == 0 and await other.claim_next() is None


@pytest_twisted.ensureDeferred
async def test_a_failed_hand_back_stops_holding_the_job(
    redis: RedisServer, model_id: str, stores: Callable[..., Any]
) -> None:
    """A hand-back that Redis never answers still drops the job from the held set: its
    lease is not renewed, so another replica re-runs it after the lease."""
    a = await stores(lease_ms=300)
    b = await stores(lease_ms=300)
    job = await a.submit(REQ)
    await a.claim_next()
    a.link._conn.transport.abortConnection()  # Redis gone for this call
    with pytest.raises(StoreUnavailable):
        await a.hand_back(job)
    assert job not in a._held

    async def requeued() -> bool:
        await b.maintain()
        return (await b.snapshot(job)).state is JobState.PENDING

    await eventually(requeued, "another replica to re-queue the job")
    assert (await b.claim_next()).attempt == 2


@pytest_twisted.ensureDeferred
async def test_progress_writes_are_coalesced_and_published_only_when_followed(
    redis: RedisServer, model_id: str, stores: Callable[..., Any]
) -> None:
    """500 steps reported at once become a couple of writes (the last step always
    lands); a ``p`` event goes out only once an event stream somewhere follows the job."""
    counters = NamedCounters()
    a = await stores()
    watcher = await stores(counters=counters)
    heard: list[str] = []
    watcher.on_change = heard.append
    job = await a.submit(REQ)
    await a.claim_next()
    calls = []
    real = a.link.script
    a.link.script = lambda name, *rest: (calls.append(name), real(name, *rest))[1]  # type: ignore[method-assign]
    for step in range(1, 501):
        a.set_progress(job, step, 500)

    async def last_step() -> bool:
        return (await a.snapshot(job)).progress == (500, 500)

    await eventually(last_step, "the last step to be written")
    assert 1 <= calls.count("progress") <= 3, calls
    assert heard == []  # nobody follows the job: no event
    stream = counters.counter(job + "#events")  # an event stream on the watcher
    watcher._refresh_follows()

    async def followed() -> bool:
        key = f"{key_prefix(model_id)}follow:{job}"
        return redis.command("EXISTS", key) == "1"

    await eventually(followed, "the follow key")
    a.set_progress(job, 1, 2)

    async def published() -> bool:
        return job in heard

    await eventually(published, "the progress event")
    stream.cancel()
    stream.addErrback(lambda _f: None)


@pytest_twisted.ensureDeferred
async def test_a_listing_scans_a_bounded_number_of_entries_and_goes_on_by_cursor(
    stores: Callable[..., Any],
) -> None:
    """Listing one principal's jobs among many of another: each call scans at most
    LIST_SCAN index entries and answers a cursor where it stopped, so a caller walks
    the whole index page by page and sees every match exactly once."""
    a = await stores(max_queue=10_000)
    mine = [(await a.admit(REQ, owner="me")).job_id]
    others = [a.admit(REQ, owner="other") for _ in range(int(LIST_SCAN * 1.5))]
    for d in others:
        await d
    mine.append((await a.admit(REQ, owner="me")).job_id)
    seen, cursor, calls = [], None, 0
    while True:
        page = await a.list_jobs(owner="me", limit=50, cursor=cursor)
        calls += 1
        seen += [s.job_id for s in page.jobs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == mine[::-1]
    assert calls == 2  # the first call stopped at the scan budget, with a cursor


@pytest_twisted.ensureDeferred
async def test_no_cancel_is_signalled_while_the_jobs_end_is_being_written(
    stores: Callable[..., Any],
) -> None:
    """A flag read back while the job's terminal write is in flight does not stop the
    (finished) run again: stopping it then would cancel that write."""
    a, b = await stores(), await stores()
    told: list[str] = []
    a.on_cancel = told.append
    job = await a.submit(REQ)
    await a.claim_next()
    assert (await b.cancel(job))[0] is CancelOutcome.REQUESTED
    ending = a.terminate(job, JobState.CANCELLED, error="stopped")
    a._cancel_held(job)  # e.g. a progress reply that arrives now
    assert await ending and told == []
