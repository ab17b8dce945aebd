"""The JobStore contract, run on both stores: the in-process ledger and Redis.

The Redis store runs against a real ``redis-server`` on a free loopback port
(tests/support/redis_server.py); every test uses its own model id, so their keys
never meet. Cases marked "shared store" are about replicas (pull, leases, events)
and run on Redis only.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import deferLater

from mortred_twisted.config.server import parse_redis_url
from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.store import StoreUnavailable, settle
from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.stores.memory_store import MemoryJobStore
from mortred_twisted.stores.redis_link import RedisLink
from mortred_twisted.stores.redis_scripts import LOST_REPLICA_ERROR
from mortred_twisted.stores.redis_store import RedisJobStore
from mortred_twisted.stores.wire import decode_request, encode_request
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port

REQ = InferenceRequest(req_id="r-1", images=(b"\x00\xffpixels",), params={"delay_ms": 5})


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


Factory = Callable[..., Any]


def redis_store(
    url: str,
    model_id: str,
    counters: NamedCounters | None = None,
    reply_timeout_s: float = 5.0,
    **kw: Any,
):
    address = parse_redis_url(url)
    options: dict[str, Any] = dict(
        max_queue=8, job_ttl_ms=300_000, max_completed=100, lease_ms=10_000,
        max_attempts=2, budget_ms=0,
    )  # fmt: skip
    options.update(kw)
    return RedisJobStore(
        reactor=reactor,
        link_factory=lambda r, **link_kw: RedisLink(
            r, address, reply_timeout_s=reply_timeout_s, **link_kw
        ),
        model_id=model_id,
        counters=counters if counters is not None else NamedCounters(),
        encode=encode_request,
        decode=decode_request,
        **options,
    )


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None for the memory store, else the URL of the test Redis."""
    if request.param == "memory":
        return None
    return request.getfixturevalue("redis").url


@pytest_twisted.async_yield_fixture
async def make_store(store_url: str | None) -> AsyncIterator[Factory]:
    """A factory of stores of one kind; every store built shares one model id."""
    built: list[Any] = []
    model_id = "T" + uuid.uuid4().hex[:8]

    async def make(**kw: Any) -> Any:
        if store_url is None:
            ledger_kw = {
                "max_queue": kw.get("max_queue", 8),
                "job_ttl_ms": kw.get("job_ttl_ms", 300_000),
                "max_completed": kw.get("max_completed", 100),
            }
            return MemoryJobStore(AsyncJobTable(**ledger_kw))
        store = redis_store(store_url, model_id, **kw)
        store.start()
        built.append(store)
        await store.link.when_connected()
        return store

    yield make
    for store in built:
        await store.stop()


async def take(store: Any, job_id: str) -> Any:
    """Move ``job_id`` to running the way the store's runner would; the request."""
    if store.pull:
        claim = await settle(store.claim_next())
        assert claim is not None and claim.job_id == job_id
        return claim.request
    return await settle(store.begin(job_id))


async def eventually(check: Callable[[], Any], what: str, tries: int = 250) -> None:
    """Re-check an asynchronous condition every 20 ms, up to ``tries`` times."""
    for _ in range(tries):
        if await check():
            return
        await deferLater(reactor, 0.02, lambda: None)
    raise AssertionError(f"timed out waiting for {what}")


@pytest_twisted.ensureDeferred
async def test_a_submitted_job_is_pending_and_counts_in_depth(make_store: Factory) -> None:
    """A new job is pending, echoes its request id and occupies one unit of depth."""
    store = await make_store()
    job = await settle(store.submit(REQ, task_id="r-1"))
    assert job is not None and job.startswith("job_")
    snap = await settle(store.snapshot(job))
    assert snap.state is JobState.PENDING and snap.task_id == "r-1" and not snap.terminal
    assert snap.queued_ms is None and snap.completed_unix is None
    assert store.queue_depth == 1


@pytest_twisted.ensureDeferred
async def test_admission_stops_at_max_queue(make_store: Factory) -> None:
    """Beyond max_queue admitted non-terminal jobs, submit answers None."""
    store = await make_store(max_queue=2)
    first = await settle(store.submit(REQ))
    second = await settle(store.submit(REQ))
    assert first and second and first != second
    assert await settle(store.submit(REQ)) is None
    assert store.queue_depth == 2
    await take(store, first)
    assert await settle(store.terminate(first, JobState.DONE, result=b"{}"))
    assert await settle(store.submit(REQ)) is not None


@pytest_twisted.ensureDeferred
async def test_running_job_hands_out_its_request_unchanged(make_store: Factory) -> None:
    """Taking a job moves it to running and gives the runner the admitted request."""
    store = await make_store()
    job = await settle(store.submit(REQ, task_id="r-1"))
    request = await take(store, job)
    assert request.req_id == REQ.req_id and request.images == REQ.images
    assert dict(request.params) == dict(REQ.params)
    snap = await settle(store.snapshot(job))
    assert snap.state is JobState.RUNNING and snap.queued_ms is not None


@pytest_twisted.ensureDeferred
async def test_terminal_transition_happens_once(make_store: Factory) -> None:
    """done stores the result (repeatable); a second terminal transition is refused
    and the depth went down exactly once."""
    store = await make_store()
    job = await settle(store.submit(REQ, task_id="r-1"))
    await take(store, job)
    assert await settle(store.terminate(job, JobState.DONE, result=b'{"ok":1}'))
    assert not await settle(store.terminate(job, JobState.FAILED, error="late"))
    assert store.queue_depth == 0
    for _ in range(2):
        lookup = await settle(store.take_result(job))
        assert lookup.found and lookup.done and lookup.result == b'{"ok":1}'
        assert lookup.task_id == "r-1"
    snap = await settle(store.snapshot(job))
    assert snap.state is JobState.DONE and snap.error is None and snap.completed_unix


@pytest.mark.parametrize("state", [JobState.FAILED, JobState.TIMEOUT])
@pytest_twisted.ensureDeferred
async def test_failed_and_timed_out_jobs_keep_their_error(
    make_store: Factory, state: JobState
) -> None:
    """failed/timeout carry the error; their result lookup is found but not done."""
    store = await make_store()
    job = await settle(store.submit(REQ))
    await take(store, job)
    assert await settle(store.terminate(job, state, error="boom: ünïcode"))
    snap = await settle(store.snapshot(job))
    assert snap.state is state and snap.error == "boom: ünïcode"
    lookup = await settle(store.take_result(job))
    assert lookup.found and not lookup.done and lookup.state is state


@pytest_twisted.ensureDeferred
async def test_a_pending_job_can_end_without_running(make_store: Factory) -> None:
    """A pending job may end (timeout in the queue, shutdown); it is never taken after."""
    store = await make_store()
    job = await settle(store.submit(REQ))
    assert await settle(store.terminate(job, JobState.TIMEOUT, error="queued too long"))
    if store.pull:
        assert await settle(store.claim_next()) is None
    else:
        assert await settle(store.begin(job)) is None
    assert store.queue_depth == 0


@pytest_twisted.ensureDeferred
async def test_unknown_ids_are_not_found(make_store: Factory) -> None:
    """Unknown ids: no snapshot, result not found, no transition."""
    store = await make_store()
    assert await settle(store.snapshot("job_nope")) is None
    assert not (await settle(store.take_result("job_nope"))).found
    assert not await settle(store.terminate("job_nope", JobState.DONE, result=b"1"))


@pytest_twisted.ensureDeferred
async def test_lru_cap_evicts_least_recently_used_terminal_jobs_only(make_store: Factory) -> None:
    """Beyond max_completed terminal jobs the least recently used goes; pending stays."""
    store = await make_store(max_completed=2, max_queue=8)
    done = []
    for _ in range(3):
        job = await settle(store.submit(REQ))
        await take(store, job)
        await settle(store.terminate(job, JobState.DONE, result=b"1"))
        done.append(job)
        if len(done) == 2:
            await settle(store.snapshot(done[0]))  # used: done[1] is now the oldest use
    waiting = await settle(store.submit(REQ))
    await settle(store.maintain())
    assert await settle(store.snapshot(done[1])) is None
    assert await settle(store.snapshot(done[0])) is not None
    assert await settle(store.snapshot(done[2])) is not None
    assert (await settle(store.snapshot(waiting))).state is JobState.PENDING


@pytest_twisted.ensureDeferred
async def test_terminal_jobs_expire_after_the_ttl(make_store: Factory) -> None:
    """A terminal job disappears after job_ttl_ms; a pending one never expires."""
    store = await make_store(job_ttl_ms=200)
    job = await settle(store.submit(REQ))
    await take(store, job)
    await settle(store.terminate(job, JobState.DONE, result=b"1"))
    waiting = await settle(store.submit(REQ))

    async def gone() -> bool:
        await settle(store.maintain())
        return await settle(store.snapshot(job)) is None

    await eventually(gone, "the finished job to expire")
    assert (await settle(store.snapshot(waiting))).state is JobState.PENDING


@pytest_twisted.ensureDeferred
async def test_progress_of_a_running_job_is_visible(make_store: Factory) -> None:
    """set_progress on a running job shows in its snapshot."""
    store = await make_store()
    job = await settle(store.submit(REQ))
    await take(store, job)
    store.set_progress(job, 3, 10)

    async def shown() -> bool:
        return (await settle(store.snapshot(job))).progress == (3, 10)

    await eventually(shown, "the progress to show")


# -- shared store: replicas ------------------------------------------------------------


class Replicas:
    """Builds started :class:`RedisJobStore` replicas of one model id on one Redis
    (``await replicas(**kw)``, ``defaults`` under ``kw``) and stops them all."""

    def __init__(self, url: str, model_id: str, **defaults: Any) -> None:
        self._url = url
        self._model_id = model_id
        self._defaults = defaults
        self._built: list[RedisJobStore] = []

    async def __call__(self, **kw: Any) -> RedisJobStore:
        store = redis_store(self._url, self._model_id, **{**self._defaults, **kw})
        store.start()
        self._built.append(store)
        await store.link.when_connected()
        return store

    async def stop_all(self) -> None:
        for store in self._built:
            await store.stop()


@pytest.fixture
def model_id() -> str:
    return "R" + uuid.uuid4().hex[:8]


@pytest_twisted.async_yield_fixture
async def replicas(redis: RedisServer, model_id: str) -> AsyncIterator[Replicas]:
    made = Replicas(redis.url, model_id)
    yield made
    await made.stop_all()


@pytest_twisted.ensureDeferred
async def test_admission_holds_across_replicas(replicas: Callable[..., Any]) -> None:
    """32 concurrent submits through two replicas admit exactly max_queue jobs."""
    a, b = await replicas(max_queue=5), await replicas(max_queue=5)
    submits = [(a if i % 2 else b).submit(REQ) for i in range(32)]
    results = await DeferredList(submits, consumeErrors=True)
    admitted = [value for ok, value in results if ok and value]
    assert len(admitted) == 5 and len(set(admitted)) == 5


@pytest_twisted.ensureDeferred
async def test_a_job_is_claimed_by_one_replica_only(replicas: Callable[..., Any]) -> None:
    """The oldest pending job goes to one replica; the other finds none."""
    a, b = await replicas(), await replicas()
    first = await a.submit(REQ)
    second = await b.submit(REQ)
    claim = await b.claim_next()
    assert claim.job_id == first and claim.attempt == 1
    assert (await a.claim_next()).job_id == second
    assert await a.claim_next() is None and await b.claim_next() is None


@pytest_twisted.ensureDeferred
async def test_terminal_events_wake_waiters_on_another_replica(
    redis: RedisServer, model_id: str, replicas: Callable[..., Any]
) -> None:
    """A counter parked on replica A fires when replica B ends the job."""
    counters = NamedCounters()
    a = redis_store(redis.url, model_id, counters)
    a.start()
    try:
        await a.link.when_connected()
        await deferLater(reactor, 0, lambda: None)
        b = await replicas()
        job = await a.submit(REQ)
        woke: Deferred[str] = counters.counter(job)
        await eventually(_subscribed(a), "replica A's subscription")
        claim = await b.claim_next()
        assert await b.terminate(claim.job_id, JobState.DONE, result=b"1")
        assert await woke == job
    finally:
        await a.stop()


@pytest_twisted.ensureDeferred
async def test_a_woken_waiter_gets_the_terminal_view_from_the_event(
    redis: RedisServer, model_id: str, replicas: Callable[..., Any]
) -> None:
    """The terminal event carries the job's view: a waiter woken on replica A reads
    it without another round trip (the snapshot is there at once), equal to what a
    read from Redis gives; nothing of it is kept once the event is delivered."""
    counters = NamedCounters()
    a = redis_store(redis.url, model_id, counters)
    a.start()
    try:
        await a.link.when_connected()
        b = await replicas()
        job = await a.submit(REQ)
        await eventually(_subscribed(a), "replica A's subscription")
        seen: list[Deferred[Any]] = []
        woke: Deferred[str] = counters.counter(job)
        woke.addCallback(lambda name: seen.append(a.snapshot(name)))
        claim = await b.claim_next()
        assert await b.terminate(claim.job_id, JobState.FAILED, error="bad \u2603 input")
        await woke
        assert seen[0].called, "the woken waiter had to read the job again"
        carried = await seen[0]
        await deferLater(reactor, 0, lambda: None)  # the event's delivery has unwound
        assert a._ended_views == {}
        read = await a.snapshot(job)
        assert carried.state is read.state is JobState.FAILED
        assert (carried.task_id, carried.error, carried.completed_unix, carried.queued_ms) == (
            read.task_id, read.error, read.completed_unix, read.queued_ms,
        )  # fmt: skip
        assert carried.elapsed_ms == read.elapsed_ms
    finally:
        await a.stop()


@pytest.mark.parametrize(
    "view",
    [b"[not json", b'{"state": "done"}', b'["done"]', b'["pending","r","1","","","","","1",2,"",1]',
     b"\xff\xfe", b"[1,2,3,4,5,6,7,8,9,10,11]", b'["done",[],{},1,2,3,4,5,6,7,8]'],
    ids=["truncated", "object", "short", "not-terminal", "not-utf8", "numbers", "nested"],
)  # fmt: skip
@pytest_twisted.ensureDeferred
async def test_a_terminal_event_with_an_unusable_view_falls_back_to_a_read(
    redis: RedisServer, model_id: str, view: bytes
) -> None:
    """A malformed or non-terminal view on the channel never becomes an answer:
    it is ignored, the waiter reads the job from Redis (here: still pending), and
    the subscriber keeps working."""
    counters = NamedCounters()
    a = redis_store(redis.url, model_id, counters)
    a.start()
    try:
        await a.link.when_connected()
        job = await a.submit(REQ)
        await eventually(_subscribed(a), "replica A's subscription")
        seen: list[Deferred[Any]] = []
        woke: Deferred[str] = counters.counter(job)
        woke.addCallback(lambda name: seen.append(a.snapshot(name)))
        channel = f"mortred:{{{model_id}}}:events"
        await a.link.call("PUBLISH", channel, b"t " + job.encode() + b" " + view)
        await woke
        assert not seen[0].called
        assert (await seen[0]).state is JobState.PENDING
        again: Deferred[str] = counters.counter(job)
        await a.link.call("PUBLISH", channel, b"t " + job.encode())
        assert await again == job
    finally:
        await a.stop()


def _subscribed(store: RedisJobStore) -> Callable[[], Any]:
    async def check() -> bool:
        return store.link._sub is not None

    return check


@pytest_twisted.ensureDeferred
async def test_a_lost_replicas_job_is_run_again_then_failed(
    replicas: Callable[..., Any],
) -> None:
    """A lease that is not renewed expires: the job is re-queued with attempt 2, and
    after max_attempts it ends failed 'interrupted: replica lost'; a late terminal
    write from the lost replica is refused."""
    lost = await replicas(lease_ms=500)
    other = await replicas(lease_ms=500)
    job = await other.submit(REQ)
    assert (await lost.claim_next()).job_id == job  # and 'lost' never renews

    async def requeued() -> bool:
        await other.maintain()
        return (await other.snapshot(job)).state is JobState.PENDING

    await eventually(requeued, "the expired lease to re-queue the job")
    claim = await other.claim_next()
    assert claim.job_id == job and claim.attempt == 2
    assert not await lost.terminate(job, JobState.DONE, result=b"stale")
    other._held.clear()  # now 'other' is lost too (max_attempts = 2)

    async def failed() -> bool:
        await lost.maintain()
        return (await lost.snapshot(job)).state is JobState.FAILED

    await eventually(failed, "the second expiry to fail the job")
    snap = await lost.snapshot(job)
    assert snap.error == LOST_REPLICA_ERROR and lost.queue_depth == 0


@pytest_twisted.ensureDeferred
async def test_renewed_leases_do_not_expire(replicas: Callable[..., Any]) -> None:
    """A replica that keeps renewing keeps its job running past the lease time."""
    a = await replicas(lease_ms=500)
    job = await a.submit(REQ)
    await a.claim_next()
    for _ in range(8):  # ~1.6 s, three lease lengths
        await a.maintain()
        await deferLater(reactor, 0.2, lambda: None)
    assert (await a.snapshot(job)).state is JobState.RUNNING


@pytest_twisted.ensureDeferred
async def test_hand_back_requeues_a_running_job(replicas: Callable[..., Any]) -> None:
    """A stopping replica hands its job back; another replica takes it (same attempt)."""
    a, b = await replicas(), await replicas()
    job = await a.submit(REQ)
    await a.claim_next()
    assert await a.hand_back(job)
    assert (await b.snapshot(job)).state is JobState.PENDING
    claim = await b.claim_next()
    assert claim.job_id == job and claim.attempt == 1


@pytest_twisted.ensureDeferred
async def test_overdue_pending_jobs_time_out(replicas: Callable[..., Any]) -> None:
    """A job nobody takes within async_timeout ends timeout 'while waiting for a worker'."""
    a = await replicas(budget_ms=200)
    job = await a.submit(REQ)

    async def timed_out() -> bool:
        await a.maintain()
        return (await a.snapshot(job)).state is JobState.TIMEOUT

    await eventually(timed_out, "the overdue job to time out")
    assert "while waiting for a worker" in (await a.snapshot(job)).error
    assert a.queue_depth == 0


@pytest_twisted.ensureDeferred
async def test_an_unreachable_store_fails_fast(model_id: str) -> None:
    """With no Redis listening, calls fail at once with StoreUnavailable."""
    store = redis_store(f"redis://127.0.0.1:{free_port()}/0", model_id)
    store.start()
    try:
        with pytest.raises(StoreUnavailable):
            await store.submit(REQ)
        with pytest.raises(StoreUnavailable):
            await store.snapshot("job_x")
    finally:
        await store.stop()


@pytest_twisted.ensureDeferred
async def test_scripts_flushed_from_redis_are_loaded_again(
    redis: RedisServer, replicas: Callable[..., Any]
) -> None:
    """After SCRIPT FLUSH the next call loads its script again instead of failing."""
    a = await replicas()
    job = await a.submit(REQ)
    redis.command("SCRIPT", "FLUSH")
    assert (await a.snapshot(job)).state is JobState.PENDING
    assert await a.submit(REQ)


@pytest_twisted.ensureDeferred
async def test_the_retention_sweep_works_in_batches(
    redis: RedisServer, model_id: str, replicas: Callable[..., Any]
) -> None:
    """600 expired terminal jobs are forgotten by successive upkeep calls, a bounded
    batch each (no script walks the whole set at once)."""
    a = await replicas(max_queue=1000, job_ttl_ms=100, max_completed=10_000)
    jobs = []
    for _ in range(600):
        jobs.append(await a.submit(REQ))
        await a.terminate(jobs[-1], JobState.TIMEOUT, error="x")
    prefix = f"mortred:{{{model_id}}}:"

    async def expired() -> bool:
        return redis.command("EXISTS", prefix + "job:" + jobs[-1]) == "0"

    await eventually(expired, "the TTL to expire the last job")
    sizes = []
    while not sizes or sizes[-1] > 0:
        await a.maintain()
        sizes.append(int(redis.command("ZCARD", prefix + "done")))
        assert len(sizes) <= 10, sizes
    assert sizes == [344, 88, 0]  # 256 per call


@pytest_twisted.ensureDeferred
async def test_a_hung_redis_fails_calls_instead_of_hanging(
    redis: RedisServer, model_id: str
) -> None:
    """A Redis that stops answering (SIGSTOP) makes calls fail with StoreUnavailable
    once the reply timeout passes; when it answers again, the store works again."""
    import os
    import signal

    store = redis_store(redis.url, model_id, reply_timeout_s=0.5)
    store.start()
    try:
        await store.link.when_connected()
        assert redis.process is not None
        os.kill(redis.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                await store.submit(REQ)
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        await store.link.when_connected()
        assert await store.submit(REQ)
    finally:
        await store.stop()


@pytest_twisted.ensureDeferred
async def test_redis_stamps_the_terminal_transition_with_microseconds(
    redis: RedisServer, model_id: str, replicas: Callable[..., Any]
) -> None:
    """``completed`` keeps µs of the Redis clock (whole ms would overstate a measured
    wake by up to 1 ms), and the snapshot's ``completed_unix`` is that value."""
    import re

    a = await replicas()
    job = await a.submit(REQ)
    await a.terminate(job, JobState.DONE, result=b"{}")
    stored = redis.command("HGET", f"mortred:{{{model_id}}}:job:{job}", "completed")
    assert re.fullmatch(r"\d{13}\.\d{3}", stored), stored
    snap = await a.snapshot(job)
    assert snap.completed_unix == float(stored) / 1000.0
    assert snap.elapsed_ms >= 0 and isinstance(snap.elapsed_ms, int)


@pytest_twisted.ensureDeferred
async def test_an_unreadable_request_in_redis_fails_its_job_once_and_the_next_runs(
    redis: RedisServer, model_id: str, replicas: Callable[..., Any]
) -> None:
    """A request payload that does not decode (damaged, or written by something else)
    ends its job ``failed`` with a clear error instead of leaving it running under a
    lease that this replica renews forever; the job behind it is still taken."""
    a = await replicas()
    bad, good = await a.submit(REQ), await a.submit(REQ)
    key = f"mortred:{{{model_id}}}:job:{bad}"
    redis.command("HSET", key, "request", "MJ1garbage, not a job")
    claim = await a.claim_next()
    assert claim is not None and claim.job_id == good and claim.request == REQ

    async def failed() -> bool:
        snap = await a.snapshot(bad)
        return snap is not None and snap.state is JobState.FAILED

    await eventually(failed, "the unreadable job to fail")
    snap = await a.snapshot(bad)
    assert snap.error is not None and snap.error.startswith("unreadable job request")
    assert redis.command("GET", f"mortred:{{{model_id}}}:depth") == "1"  # only `good`
    assert redis.command("ZCARD", f"mortred:{{{model_id}}}:leases") == "1"  # only `good`
