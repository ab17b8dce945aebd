# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""Retention per caller on both stores (issue 19 item 1): beyond ``max_completed``
finished jobs the least recently used job of the caller holding the most goes
(jobs/retention.py), so one caller's finished jobs never evict another's results
while that caller is within its share. The Redis store does it in the terminal
transition's Lua step; a seeded sequence of finishes and uses evicts the same jobs on
both stores. Against a real ``redis-server``."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_twisted

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import TERMINAL_STATES, JobState
from mortred_twisted.jobs.store import settle
from mortred_twisted.stores.memory_store import MemoryJobStore
from tests.stores.test_store_contract import (  # noqa: F401
    REQ,
    Factory,
    Replicas,
    eventually,
    make_store,
    redis,
    redis_store,
    store_url,
    take,
)
from tests.support.redis_server import RedisServer

TERMINAL = frozenset(TERMINAL_STATES)


async def finish(store: Any, owner: str, task_id: str, state: JobState = JobState.DONE) -> str:
    """Admit, run and end one job of ``owner``; upkeep after it (the memory store
    evicts at admission and upkeep, Redis in the terminal transition)."""
    job = (await settle(store.admit(REQ, task_id, owner=owner))).job_id
    assert job is not None
    await take(store, job)
    assert await settle(store.terminate(job, state, result=b"1", error="x"))
    await settle(store.maintain())
    return job


async def retained(store: Any) -> set[str]:
    """The task ids of the finished jobs the store keeps (a listing is not a use)."""
    page = await settle(store.list_jobs(owner=None, states=TERMINAL, limit=1000))
    return {snap.task_id for snap in page.jobs}


@pytest_twisted.ensureDeferred
async def test_a_callers_results_survive_anothers_flood(make_store: Factory) -> None:
    """max_completed 4: B's two results survive A finishing ten jobs; A keeps its
    two most recent."""
    store = await make_store(max_completed=4, max_queue=20)
    b_jobs = [await finish(store, "B", f"b{i}") for i in range(2)]
    for i in range(10):
        await finish(store, "A", f"a{i}")
    assert await retained(store) == {"b0", "b1", "a8", "a9"}
    for job in b_jobs:
        lookup = await settle(store.take_result(job))
        assert lookup.found and lookup.done and lookup.owner == "B"


@pytest_twisted.ensureDeferred
async def test_equal_holders_lose_the_oldest_unused_job_first(make_store: Factory) -> None:
    """Two callers holding as many finished jobs as each other: the one whose least
    recently used job is the oldest loses it; a poll makes a job recently used."""
    store = await make_store(max_completed=3, max_queue=20)
    a0 = await finish(store, "A", "a0")
    await finish(store, "B", "b0")
    a1 = await finish(store, "A", "a1")
    await settle(store.snapshot(a0))  # A's oldest use is now a1, newer than b0
    b1 = await finish(store, "B", "b1")  # 2 : 2 over 3 -> b0 is the oldest unused
    assert await retained(store) == {"a0", "a1", "b1"}
    for job in (b1, a1, a0):  # b1 is now the least recently used of all
        await settle(store.snapshot(job))
    await finish(store, "C", "c0")  # but A holds the most: its least recently used goes
    assert await retained(store) == {"a0", "b1", "c0"}


@pytest_twisted.ensureDeferred
async def test_both_stores_evict_the_same_jobs(redis: RedisServer) -> None:
    """A seeded run of finishes (done, failed, cancelled while pending), polls and
    result fetches by three callers leaves the same finished jobs on both stores
    after every step."""
    rng = random.Random(19)
    memory = MemoryJobStore(AsyncJobTable(max_queue=10, max_completed=5))
    red = redis_store(redis.url, "E" + uuid.uuid4().hex[:8], max_completed=5)
    red.start()
    await red.link.when_connected()
    ids: dict[Any, dict[str, str]] = {memory: {}, red: {}}
    try:
        for step in range(120):
            roll = rng.random()
            owner = rng.choice("AAABBC")
            task = f"t{step}"
            state = rng.choice([JobState.DONE, JobState.FAILED])
            known = sorted(ids[memory])
            for store in (memory, red):
                if roll < 0.5:
                    ids[store][task] = await finish(store, owner, task, state)
                elif roll < 0.6:
                    job = (await settle(store.admit(REQ, task, owner=owner))).job_id
                    ids[store][task] = job
                    await settle(store.cancel(job))
                    await settle(store.maintain())
                elif known:
                    pick = known[int(roll * 1000) % len(known)]
                    if roll < 0.8:
                        await settle(store.snapshot(ids[store][pick]))
                    else:
                        await settle(store.take_result(ids[store][pick]))
            kept = await retained(memory)
            assert len(kept) <= 5
            assert await retained(red) == kept, step
    finally:
        await red.stop()


# -- Redis only -----------------------------------------------------------------------


@pytest.fixture
def model_id() -> str:
    return "Q" + uuid.uuid4().hex[:8]


@pytest_twisted.async_yield_fixture
async def replica(redis: RedisServer, model_id: str) -> AsyncIterator[Replicas]:
    made = Replicas(redis.url, model_id)
    yield made
    await made.stop_all()


@pytest_twisted.ensureDeferred
async def test_expired_results_leave_the_callers_counts(
    redis: RedisServer, model_id: str, replica: Callable[..., Any]
) -> None:
    """Finished jobs whose TTL ran out are forgotten by the upkeep sweep together
    with their place in their caller's retention (nothing of them is left)."""
    store = await replica(job_ttl_ms=100, max_queue=20)
    for i in range(3):
        await finish(store, "A", f"a{i}")
    await finish(store, "", "mine")
    prefix = f"mortred:{{{model_id}}}:"
    assert redis.command("ZSCORE", prefix + "holders", "A") == "3"

    async def swept() -> bool:
        await store.maintain()
        return redis.command("ZCARD", prefix + "done") == "0"

    await eventually(swept, "the sweep to forget the expired jobs")
    assert redis.command("ZCARD", prefix + "holders") == "0"
    assert redis.command("HLEN", prefix + "done_owner") == "0"
    assert redis.command("EXISTS", prefix + "done:A", prefix + "done:") == "0"


@pytest_twisted.ensureDeferred
async def test_replicas_share_one_retention(replica: Callable[..., Any]) -> None:
    """Retention counts every replica's finished jobs: A finishing on one replica
    evicts A's own results, not B's that another replica finished."""
    one, two = await replica(max_completed=2), await replica(max_completed=2)
    b_job = await finish(two, "B", "b0")
    for i in range(3):
        await finish(one, "A", f"a{i}")
    assert await retained(one) == {"b0", "a2"}
    assert (await two.take_result(b_job)).done
