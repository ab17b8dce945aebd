# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""The job-API operations of the JobStore contract, on both stores (memory and a real
Redis): cancel, idempotent admission, listing per principal, queue position, webhook
and cancel-flag lookups, and the cancel announcement between replicas."""

from __future__ import annotations

import uuid

import pytest
import pytest_twisted

from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.store import settle
from tests.stores.test_store_contract import (  # noqa: F401 - fixtures
    REQ,
    Factory,
    eventually,
    make_store,
    redis,
    redis_store,
    store_url,
    take,
)


@pytest_twisted.ensureDeferred
async def test_cancel_pending_running_and_finished(make_store: Factory) -> None:
    """Pending ends cancelled at once (depth freed, never claimed); running is only
    flagged; finished and unknown jobs are reported as such."""
    store = await make_store(max_queue=2)
    first = (await settle(store.admit(REQ, "r1"))).job_id
    second = (await settle(store.admit(REQ, "r2"))).job_id
    assert (await settle(store.snapshot(second))).queue_position == 2
    await take(store, first)
    assert (await settle(store.snapshot(second))).queue_position == 1
    outcome, snap = await settle(store.cancel(second))
    assert outcome is CancelOutcome.CANCELLED and snap.state is JobState.CANCELLED
    assert snap.error == "cancelled by request" and snap.queue_position is None
    assert (await settle(store.admit(REQ, "r3"))).job_id is not None  # the slot came back
    if store.pull:
        claim = await settle(store.claim_next())
        assert claim is not None and claim.job_id not in (second,)
    outcome, snap = await settle(store.cancel(first))
    assert outcome is CancelOutcome.REQUESTED
    assert snap.state is JobState.RUNNING and snap.cancel_requested
    assert await settle(store.cancel_requested(first))
    assert await settle(store.terminate(first, JobState.CANCELLED, error="stopped"))
    outcome, snap = await settle(store.cancel(first))
    assert outcome is CancelOutcome.FINISHED and snap.state is JobState.CANCELLED
    assert not snap.cancel_requested
    assert await settle(store.cancel("job_000000000000000000000000")) == (
        CancelOutcome.UNKNOWN,
        None,
    )
    lookup = await settle(store.take_result(second))
    assert lookup.found and lookup.state is JobState.CANCELLED and not lookup.done


@pytest_twisted.ensureDeferred
async def test_terminate_answers_the_state_a_flagged_job_ended_in(make_store: Factory) -> None:
    """A run that asks to end a cancel-flagged job done is told it ended cancelled
    (its result dropped), on both stores; a second end is refused with None."""
    store = await make_store()
    job = (await settle(store.admit(REQ, "r1"))).job_id
    await take(store, job)
    outcome, _snap = await settle(store.cancel(job))
    assert outcome is CancelOutcome.REQUESTED
    assert await settle(store.terminate(job, JobState.DONE, result=b"{}")) is JobState.CANCELLED
    assert (await settle(store.snapshot(job))).state is JobState.CANCELLED
    assert not (await settle(store.take_result(job))).done
    assert await settle(store.terminate(job, JobState.FAILED, error="late")) is None
    other = (await settle(store.admit(REQ, "r2"))).job_id
    await take(store, other)
    assert await settle(store.terminate(other, JobState.DONE, result=b"{}")) is JobState.DONE


@pytest_twisted.ensureDeferred
async def test_idempotent_admission_replays_conflicts_and_is_scoped(make_store: Factory) -> None:
    """Same principal, key and fingerprint replay; another fingerprint conflicts; another
    principal's same key is a new job; a full queue still replays."""
    store = await make_store(max_queue=2)
    first = await settle(store.admit(REQ, "r", owner="alice", idempotency_key="k", fingerprint="f"))
    assert first.job_id and not first.replayed
    again = await settle(store.admit(REQ, "r", owner="alice", idempotency_key="k", fingerprint="f"))
    assert again.job_id == first.job_id and again.replayed
    clash = await settle(store.admit(REQ, "r", owner="alice", idempotency_key="k", fingerprint="g"))
    assert clash.conflict and clash.job_id is None
    bob = await settle(store.admit(REQ, "r", owner="bob", idempotency_key="k", fingerprint="g"))
    assert bob.job_id not in (None, first.job_id)
    full = await settle(store.admit(REQ, "r", owner="carol"))
    assert full.job_id is None and not full.conflict  # max_queue 2 reached
    replay = await settle(
        store.admit(REQ, "r", owner="alice", idempotency_key="k", fingerprint="f")
    )
    assert replay.job_id == first.job_id and replay.replayed
    assert store.queue_depth == 2


#: (principal, key) pairs that one "principal:key" string would confuse
AMBIGUOUS = [
    ("a:b", "c"), ("a", "b:c"), ("a:b:c", "x"), ("", "a:b:c:x"), ("1:a", "b"), ("1", "a:b"),
    ("3:a:b", "c"), ("", "3:a:b:c"),
]  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_each_principal_key_pair_is_its_own_scope(make_store: Factory) -> None:
    """Pairs that join to the same text with ':' (a principal or key holding ':', or
    one shaped like the encoding) are distinct: each admits its own job and replays
    only its own, the same on both stores."""
    store = await make_store(max_queue=len(AMBIGUOUS))
    jobs = {}
    for owner, key in AMBIGUOUS:
        got = await settle(store.admit(REQ, "r", owner=owner, idempotency_key=key, fingerprint="f"))
        assert got.job_id is not None and not got.replayed, (owner, key)
        jobs[owner, key] = got.job_id
    assert len(set(jobs.values())) == len(AMBIGUOUS)
    for (owner, key), job in jobs.items():
        again = await settle(
            store.admit(REQ, "r", owner=owner, idempotency_key=key, fingerprint="f")
        )
        assert again.replayed and again.job_id == job, (owner, key)
        other = await settle(
            store.admit(REQ, "r", owner=owner, idempotency_key=key, fingerprint="g")
        )
        assert other.conflict, (owner, key)


@pytest_twisted.ensureDeferred
async def test_a_key_is_forgotten_with_its_job(make_store: Factory) -> None:
    """Once retention drops the key's job, the key admits a new job."""
    store = await make_store(max_completed=0)
    first = (await settle(store.admit(REQ, "r", idempotency_key="k", fingerprint="f"))).job_id
    await take(store, first)
    assert await settle(store.terminate(first, JobState.DONE, result=b"{}"))
    await settle(store.maintain())
    fresh = await settle(store.admit(REQ, "r", idempotency_key="k", fingerprint="f"))
    assert fresh.job_id not in (None, first) and not fresh.replayed


@pytest_twisted.ensureDeferred
async def test_listing_is_newest_first_per_principal_with_states_and_cursor(
    make_store: Factory,
) -> None:
    """A principal lists its own jobs newest first, pages by cursor, filters by state."""
    store = await make_store(max_queue=16)
    alice = [(await settle(store.admit(REQ, f"a{i}", owner="alice"))).job_id for i in range(3)]
    bob = (await settle(store.admit(REQ, "b", owner="bob"))).job_id
    page = await settle(store.list_jobs(owner="alice", limit=2))
    assert [s.job_id for s in page.jobs] == [alice[2], alice[1]] and page.next_cursor
    rest = await settle(store.list_jobs(owner="alice", limit=2, cursor=page.next_cursor))
    assert [s.job_id for s in rest.jobs] == [alice[0]] and rest.next_cursor is None
    everyone = await settle(store.list_jobs(owner=None, limit=10))
    assert [s.job_id for s in everyone.jobs] == [bob, *reversed(alice)]
    await settle(store.cancel(alice[1]))
    cancelled = await settle(
        store.list_jobs(owner="alice", states=frozenset({JobState.CANCELLED}), limit=10)
    )
    assert [s.job_id for s in cancelled.jobs] == [alice[1]]
    with pytest.raises(ValueError):
        await settle(store.list_jobs(owner=None, cursor="nope"))


@pytest_twisted.ensureDeferred
async def test_webhook_is_kept_with_the_job(make_store: Factory) -> None:
    """The webhook a job was admitted with is found again (and none for other jobs)."""
    store = await make_store()
    hook = ("https://hooks.example.com/x", frozenset({"completed", "start"}))
    with_hook = (await settle(store.admit(REQ, "r", webhook=hook))).job_id
    without = (await settle(store.admit(REQ, "r"))).job_id
    assert await settle(store.webhook_of(with_hook)) == hook
    assert await settle(store.webhook_of(without)) is None


@pytest_twisted.ensureDeferred
async def test_a_cancel_on_one_replica_reaches_the_replica_running_the_job(
    store_url: str | None,
) -> None:
    """Shared store: replica A cancels a job replica B runs; B is told (on_cancel) and
    every replica's event streams hear of B's terminal transition."""
    if store_url is None:
        pytest.skip("shared store only: the memory store has one process")
    model_id = "X" + uuid.uuid4().hex[:8]
    a, b = redis_store(store_url, model_id), redis_store(store_url, model_id)
    told: list[str] = []
    changed: list[str] = []
    b.on_cancel = told.append
    a.on_change = changed.append
    for s in (a, b):
        s.start()
        await s.link.when_connected()
    try:
        job = (await settle(a.admit(REQ, "r"))).job_id
        claim = await settle(b.claim_next())
        assert claim is not None and claim.job_id == job
        outcome, _snap = await settle(a.cancel(job))
        assert outcome is CancelOutcome.REQUESTED

        async def b_was_told() -> bool:
            return told == [job]

        await eventually(b_was_told, "the cancel announcement")
        assert await settle(b.terminate(job, JobState.CANCELLED, error="stopped"))

        async def a_heard_the_end() -> bool:
            return job in changed

        await eventually(a_heard_the_end, "the terminal event on replica A")
        assert (await settle(a.snapshot(job))).state is JobState.CANCELLED
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_a_flagged_job_handed_back_ends_cancelled_instead_of_running_again(
    store_url: str | None,
) -> None:
    """Shared store: a running job asked to stop, then handed back (its replica stopped),
    is not run again by the next claim: it ends cancelled."""
    if store_url is None:
        pytest.skip("shared store only: the memory store has one process")
    store = redis_store(store_url, "H" + uuid.uuid4().hex[:8])
    store.start()
    await store.link.when_connected()
    try:
        job = (await settle(store.admit(REQ, "r"))).job_id
        assert (await settle(store.claim_next())).job_id == job
        assert (await settle(store.cancel(job)))[0] is CancelOutcome.REQUESTED
        assert await settle(store.hand_back(job))
        assert await settle(store.claim_next()) is None
        snap = await settle(store.snapshot(job))
        assert snap.state is JobState.CANCELLED
        assert (await settle(store.admit(REQ, "r"))).job_id is not None
        assert store.queue_depth == 1  # the cancelled job's unit of depth came back
    finally:
        await store.stop()
