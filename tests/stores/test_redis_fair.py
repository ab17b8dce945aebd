# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""The fair order and the callers' quotas on the Redis store (issue 19 item 4): CLAIM
takes jobs in the same order as the memory ledger (one Lua step for every replica),
ADMIT checks the caller's own limit, and a job handed back or requeued after a lost
replica keeps its place; a lost replica and a restart of every replica (and of
Redis) keep the order and the quotas. Against a real ``redis-server``; the state
machine over all of it is tests/stores/test_redis_fair_machine.py."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted

from mortred_twisted.jobs.fair_queue import CallerTerms, FairQueue
from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.stores.redis_store import RedisJobStore
from tests.stores.test_store_contract import (  # noqa: F401
    REQ,
    Replicas,
    eventually,
    redis,
    redis_store,
)
from tests.support.redis_server import RedisServer, redis_server


@pytest.fixture
def model_id() -> str:
    return "F" + uuid.uuid4().hex[:8]


@pytest_twisted.async_yield_fixture
async def stores(redis: RedisServer, model_id: str) -> AsyncIterator[Replicas]:
    made = Replicas(redis.url, model_id, max_queue=1000)
    yield made
    await made.stop_all()


async def claim_all(store: RedisJobStore, n: int) -> list[str]:
    order = []
    for _ in range(n):
        claim = await store.claim_next()
        assert claim is not None
        order.append(claim.job_id)
    return order


@pytest_twisted.ensureDeferred
async def test_a_small_caller_is_not_stuck_behind_a_flood(stores: Callable[..., Any]) -> None:
    """A has 40 pending, B then submits 4 (equal weights): B's start within the next
    ten claims, on two replicas taking turns (one global order)."""
    a, b = await stores(), await stores()
    mine = {}
    for i in range(40):
        mine[(await a.admit(REQ, f"a{i}", owner="A")).job_id] = f"a{i}"
    await claim_all(a, 2)
    for i in range(4):
        mine[(await b.admit(REQ, f"b{i}", owner="B")).job_id] = f"b{i}"
    order = [mine[j] for j in await claim_all(a, 5) + await claim_all(b, 5)]
    assert [t for t in order if t.startswith("b")] == ["b0", "b1", "b2", "b3"]
    assert order.index("b3") < 10


@pytest_twisted.ensureDeferred
async def test_the_same_order_as_the_memory_ledger(stores: Callable[..., Any]) -> None:
    """Three callers with weights 1, 2, 3 and mixed bands: Redis claims in exactly the
    order the memory ledger starts them, and queue positions agree."""
    store = await stores()
    ids = itertools.count(1)
    ledger: AsyncJobTable[str] = AsyncJobTable(max_queue=1000, id_factory=lambda: f"m{next(ids)}")
    plan = [("A", 1, "normal"), ("B", 2, "normal"), ("C", 3, "high"), ("A", 1, "low")] * 6
    names: dict[str, str] = {}
    mem: dict[str, str] = {}
    for n, (caller, weight, band) in enumerate(plan):
        terms = CallerTerms(weight=weight, max_priority="high")
        job = (await store.admit(REQ, f"t{n}", owner=caller, terms=terms, priority=band)).job_id
        names[job] = f"t{n}"
        mem[ledger.admit("r", f"t{n}", owner=caller, terms=terms, priority=band).job_id] = f"t{n}"
    first = next(iter(names))
    assert (await store.snapshot(first)).queue_position == ledger.snapshot("m1").queue_position
    redis_order = [names[j] for j in await claim_all(store, len(plan))]
    memory_order = []
    while (job := ledger.next_pending()) is not None:
        ledger.transition_running(job)
        memory_order.append(mem[job])
    assert redis_order == memory_order
    assert await store.claim_next() is None


@pytest_twisted.ensureDeferred
async def test_a_caller_over_its_quota_is_refused_with_over_quota(
    stores: Callable[..., Any],
) -> None:
    """The caller's limit counts pending + running; ending a job frees a place; the
    model default applies without the key's own number."""
    store = await stores(max_pending_per_caller=2)
    first = (await store.admit(REQ, owner="A")).job_id
    assert (await store.admit(REQ, owner="A")).job_id is not None
    refused = await store.admit(REQ, owner="A")
    assert refused.job_id is None and refused.over_quota and refused.limit == 2
    assert (await store.admit(REQ, owner="B")).job_id is not None
    one = CallerTerms(max_pending=1)
    assert (await store.admit(REQ, owner="C", terms=one)).job_id is not None
    assert (await store.admit(REQ, owner="C", terms=one)).over_quota
    claim = await store.claim_next()
    assert claim is not None and claim.job_id == first
    assert (await store.admit(REQ, owner="A")).over_quota  # running counts too
    assert await store.terminate(first, JobState.DONE, result=b"{}")
    assert (await store.admit(REQ, owner="A")).job_id is not None


@pytest_twisted.ensureDeferred
async def test_a_job_handed_back_keeps_its_place(stores: Callable[..., Any]) -> None:
    """A replica that stops hands its job back: it is claimed again before the jobs
    admitted after it (its start tag is kept), and the quotas are unchanged."""
    a, b = await stores(max_pending_per_caller=3), await stores(max_pending_per_caller=3)
    jobs = [(await a.admit(REQ, owner="A")).job_id for _ in range(3)]
    claim = await a.claim_next()
    assert claim is not None and claim.job_id == jobs[0]
    assert await a.hand_back(jobs[0])
    assert (await b.admit(REQ, owner="A")).over_quota
    assert await claim_all(b, 3) == jobs


@pytest_twisted.ensureDeferred
async def test_a_restarted_replica_keeps_the_order_and_the_quotas(
    stores: Callable[..., Any],
) -> None:
    """The order and the counts live in Redis: a replica started after the first one
    stopped claims B's job second (not after A's backlog) and still refuses A."""
    first = await stores(max_pending_per_caller=4)
    a_jobs = [(await first.admit(REQ, owner="A")).job_id for _ in range(4)]
    b_job = (await first.admit(REQ, owner="B")).job_id
    await first.stop()
    again = await stores(max_pending_per_caller=4)
    assert (await again.admit(REQ, owner="A")).over_quota
    assert await claim_all(again, 3) == [a_jobs[0], b_job, a_jobs[1]]


@pytest_twisted.ensureDeferred
async def test_the_queue_view_counts_each_caller(stores: Callable[..., Any]) -> None:
    """GET /queue's view on Redis: depth, pending, running per caller (counts kept by
    ADMIT, CLAIM, requeue and TERMINATE), the caller's limit, only its own line when
    asked for one caller; a caller with nothing held has a zero line."""
    store = await stores(max_pending_per_caller=5)
    a_jobs = [(await store.admit(REQ, owner="A")).job_id for _ in range(3)]
    await store.admit(REQ, owner="B", terms=CallerTerms(max_pending=9))
    claim = await store.claim_next()
    assert claim is not None and claim.job_id == a_jobs[0]
    view = await store.queue_view()
    assert (view.depth, view.pending, view.running) == (4, 3, 1)
    lines = {line.caller: line for line in view.callers}
    assert (lines["A"].pending, lines["A"].running, lines["A"].limit) == (2, 1, 5)
    assert (lines["B"].pending, lines["B"].running, lines["B"].limit) == (1, 0, 9)
    assert lines["A"].oldest_wait_ms >= 0 and view.oldest_wait_ms >= lines["B"].oldest_wait_ms
    assert await store.hand_back(a_jobs[0])
    assert [(c.pending, c.running) for c in (await store.queue_view("A")).callers] == [(3, 0)]
    await store.terminate(a_jobs[1], JobState.CANCELLED, error="x")
    assert [(c.pending, c.running) for c in (await store.queue_view("A")).callers] == [(2, 0)]
    assert [c.caller for c in (await store.queue_view("nobody")).callers] == ["nobody"]


def _spec_order(spec: FairQueue) -> list[str]:
    """Start every pending job of ``spec`` in its order."""
    order = []
    while (job := spec.next()) is not None:
        assert spec.start(job)
        order.append(job)
    return order


async def _lines(store: RedisJobStore) -> dict[str, tuple[int, int]]:
    view = await store.queue_view()
    return {line.caller: (line.pending, line.running) for line in view.callers}


@pytest_twisted.ensureDeferred
async def test_a_lost_replicas_job_runs_elsewhere_in_its_place(
    stores: Callable[..., Any],
) -> None:
    """A replica dies holding A's first job (its lease runs out): another replica
    re-queues it, claims it first again and B's jobs keep their turns (the spec's
    order); A's quota counts the job once throughout (no place leaked, none counted
    twice) and the dead replica's late result is refused."""
    lost = await stores(lease_ms=300, max_pending_per_caller=3)
    other = await stores(lease_ms=300, max_pending_per_caller=3)
    spec = FairQueue()
    for n, who in enumerate("AAABB"):
        job = (await other.admit(REQ, f"{who}{n}", owner=who)).job_id
        spec.push(job, who, n)
    claim = await lost.claim_next()  # and 'lost' never renews its lease again
    assert claim is not None and claim.job_id == spec.next() and spec.start(claim.job_id)
    assert await _lines(other) == {"A": (2, 1), "B": (2, 0)}

    async def requeued() -> bool:
        await other.maintain()
        return (await other.snapshot(claim.job_id)).state is JobState.PENDING

    await eventually(requeued, "the expired lease to re-queue the job")
    assert spec.requeue(claim.job_id)
    assert await _lines(other) == {"A": (3, 0), "B": (2, 0)}
    assert (await other.admit(REQ, owner="A")).over_quota
    order = await claim_all(other, 5)
    assert order == _spec_order(spec) and order[0] == claim.job_id
    assert not await lost.terminate(claim.job_id, JobState.DONE, result=b"late")
    assert await _lines(other) == {"A": (0, 3), "B": (0, 2)}
    for job in order:
        assert await other.terminate(job, JobState.DONE, result=b"{}")
    assert await _lines(other) == {}
    assert (await other.admit(REQ, owner="A")).job_id is not None


@pytest_twisted.ensureDeferred
async def test_a_restart_of_every_replica_and_of_redis_keeps_order_and_quotas() -> None:
    """Two replicas hold a mixed backlog (three callers, weights 1-3, three bands)
    and one running job; both replicas stop, Redis restarts from its append-only
    file, two new replicas start: the counts and the refusals are the same, the
    running job comes back in its place once its lease runs out, and every job is
    claimed in the spec's order."""
    terms = {"A": CallerTerms(weight=1, max_pending=4, max_priority="high"),
             "B": CallerTerms(weight=2, max_priority="high"),
             "C": CallerTerms(weight=3, max_priority="high")}  # fmt: skip
    plan = [("A", "normal"), ("B", "normal"), ("C", "high"), ("A", "low"), ("B", "high"),
            ("A", "normal"), ("C", "low"), ("B", "normal"), ("A", "high"),
            ("C", "normal")]  # fmt: skip
    model_id = "S" + uuid.uuid4().hex[:8]
    spec = FairQueue()
    with redis_server() as server:
        options = dict(max_queue=100, lease_ms=300, max_pending_per_caller=6)
        first = [redis_store(server.url, model_id, **options) for _ in range(2)]
        for store in first:
            store.start()
            await store.link.when_connected()
        for n, (who, band) in enumerate(plan):
            job = (await first[n % 2].admit(REQ, owner=who, terms=terms[who], priority=band)).job_id
            spec.push(job, who, n, weight=terms[who].weight, band=band)
        done = await first[0].claim_next()
        running = await first[1].claim_next()  # its replica stops holding it
        for claim in (done, running):
            assert claim is not None and claim.job_id == spec.next() and spec.start(claim.job_id)
        assert await first[0].terminate(done.job_id, JobState.DONE, result=b"{}")
        spec.release(done.job_id)
        before = await _lines(first[0])
        assert (await first[0].admit(REQ, owner="A", terms=terms["A"])).over_quota
        for store in first:
            await store.stop()
        server.restart()
        again = [redis_store(server.url, model_id, **options) for _ in range(2)]
        try:
            for store in again:
                store.start()
                await store.link.when_connected()
            assert await _lines(again[0]) == before
            assert (await again[1].admit(REQ, owner="A", terms=terms["A"])).over_quota

            async def requeued() -> bool:
                await again[0].maintain()
                return (await again[0].snapshot(running.job_id)).state is JobState.PENDING

            await eventually(requeued, "the stopped replica's lease to run out")
            assert spec.requeue(running.job_id)
            order = [(await again[n % 2].claim_next()).job_id for n in range(len(plan) - 1)]
            assert order == _spec_order(spec)
            assert await again[0].claim_next() is None
        finally:
            for store in again:
                await store.stop()
