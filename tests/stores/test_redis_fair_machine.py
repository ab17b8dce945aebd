# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""A hypothesis state machine over the Redis store's fair order, quotas and
retention (issue 19 items 4 and 6): admission, pick (CLAIM, on either of two
replicas), cancel, completion, hand-back and lease loss, against the spec
(:class:`~mortred_twisted.jobs.fair_queue.FairQueue` for the order and the counts,
:class:`~mortred_twisted.jobs.retention.RetainedJobs` for retention).

Invariants after every step: no caller above its quota (Redis's counts equal the
spec's: nothing leaked or counted twice), every pick is the spec's next job, no
pending job waits more than its bound of starts, and the finished jobs kept are the
spec's. A lost lease is made by the test (the replica forgets the job, its lease is
set in the past, the other replica's upkeep reclaims it), so nothing waits for time.
The machine runs in a thread; each store call runs on the reactor thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest_twisted
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.threads import blockingCallFromThread, deferToThread

from mortred_twisted.jobs.fair_queue import PRIORITIES, CallerTerms, FairQueue
from mortred_twisted.jobs.retention import RetainedJobs
from mortred_twisted.jobs.states import TERMINAL_STATES, CancelOutcome, JobState
from mortred_twisted.stores.redis_store import RedisJobStore
from tests.stores.test_store_contract import REQ, redis, redis_store  # noqa: F401
from tests.support.redis_server import RedisServer

CALLERS = {"a": CallerTerms(weight=1, max_pending=4, max_priority="high"),
           "b": CallerTerms(weight=2, max_priority="high"),
           "c": CallerTerms(weight=3, max_pending=2, max_priority="high")}  # fmt: skip
PER_CALLER = 5
MAX_QUEUE = 9
MAX_WEIGHT = 3
MAX_COMPLETED = 4
MAX_ATTEMPTS = 3


def on_reactor(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run ``fn`` on the reactor thread and wait for its (Deferred) result: the
    machine runs in a thread of its own while the reactor runs the stores."""
    return blockingCallFromThread(reactor, fn, *args, **kw)


async def _started(url: str, model_id: str, options: dict[str, Any]) -> RedisJobStore:
    store = redis_store(url, model_id, **options)
    store.start()
    await store.link.when_connected()
    return store


def _reclaim_now(store: RedisJobStore) -> Any:
    """Upkeep that reclaims expired leases now (a replica waits one lease after it
    connects before it does: there is no outage here)."""
    store._reclaim_from = 0.0
    return store.maintain()


class RedisFairMachine(RuleBasedStateMachine):
    """Two replicas of one model id on a real Redis, and the spec beside them."""

    url = ""

    def __init__(self) -> None:
        super().__init__()
        model_id = "M" + uuid.uuid4().hex[:8]
        options = dict(max_queue=MAX_QUEUE, max_completed=MAX_COMPLETED,
                       max_attempts=MAX_ATTEMPTS, max_pending_per_caller=PER_CALLER)  # fmt: skip
        self.replicas: list[RedisJobStore] = []
        for _ in range(2):
            self.replicas.append(
                on_reactor(lambda: Deferred.fromCoroutine(_started(self.url, model_id, options)))
            )
        self.fair = FairQueue()
        self.kept = RetainedJobs()
        self.seq = 0
        self.owner: dict[str, str] = {}  # active job -> caller
        self.holder: dict[str, int] = {}  # running job -> replica index
        self.attempt: dict[str, int] = {}
        self.flagged: set[str] = set()  # running (or handed back) with a cancel
        self.waited: dict[str, int] = {}  # pending job -> fresh starts since queued
        self.bound: dict[str, int] = {}
        self.known: list[str] = []
        self.again: set[str] = set()  # pending after a hand-back or a lost lease

    def teardown(self) -> None:
        for store in self.replicas:
            on_reactor(store.stop)

    # -- the spec's side effects ---------------------------------------------------

    def _queued(self, job_id: str) -> None:
        ahead = len(self.waited)
        self.waited[job_id] = 0
        # as tests/jobs/test_fair_queue.py: the band's jobs ahead, each flow's jobs
        # with a smaller tag, and the other bands' starts per start of this band
        flows = len(CALLERS)
        self.bound[job_id] = 23 * (ahead + 2 + flows * ((ahead + 1) * MAX_WEIGHT + 1))

    def _ended(self, job_id: str) -> None:
        assert self.fair.release(job_id)
        caller = self.owner.pop(job_id)
        self.holder.pop(job_id, None)
        self.waited.pop(job_id, None)
        self.bound.pop(job_id, None)
        self.again.discard(job_id)
        self.flagged.discard(job_id)
        self.kept.add(job_id, caller, 0.0)
        while (victim := self.kept.victim(MAX_COMPLETED)) is not None:
            self.kept.remove(victim)

    def _limit(self, caller: str) -> int:
        return CALLERS[caller].max_pending or PER_CALLER

    def _in_order(self, jobs: Any) -> list[str]:
        """``jobs`` in admission order: job ids are random, so a draw by place must
        not depend on them (a replayed example draws the same job)."""
        return sorted(jobs, key=self.known.index)

    def _running(self) -> list[str]:
        return self._in_order(self.holder)

    # -- rules ---------------------------------------------------------------------

    @rule(caller=st.sampled_from(sorted(CALLERS)), band=st.sampled_from(PRIORITIES),
          via=st.integers(0, 1))  # fmt: skip
    def admit(self, caller: str, band: str, via: int) -> None:
        got = on_reactor(self.replicas[via].admit, REQ, owner=caller, terms=CALLERS[caller],
                                            priority=band)  # fmt: skip
        if self.fair.active(caller) >= self._limit(caller):
            assert got.job_id is None and got.over_quota and got.limit == self._limit(caller)
            return
        if len(self.owner) >= MAX_QUEUE:
            assert got.job_id is None and not got.over_quota
            return
        assert got.job_id is not None
        self.seq += 1
        self.fair.push(got.job_id, caller, self.seq, weight=CALLERS[caller].weight, band=band)
        self.owner[got.job_id] = caller
        self.attempt[got.job_id] = 1
        self.known.append(got.job_id)
        self._queued(got.job_id)

    @rule(via=st.integers(0, 1))
    def pick(self, via: int) -> None:
        claim = on_reactor(self.replicas[via].claim_next)
        expected = self.fair.next()
        while expected is not None and expected in self.flagged:
            self._ended(expected)  # CLAIM ends a handed-back cancelled job
            expected = self.fair.next()
        assert (claim.job_id if claim else None) == expected
        if claim is None:
            return
        assert claim.attempt == self.attempt[expected]
        assert self.fair.start(expected)
        self.holder[expected] = via
        del self.waited[expected], self.bound[expected]
        fresh = expected not in self.again
        self.again.discard(expected)
        if fresh:  # a re-delivery is not a new start: others are not charged for it
            for job_id in self.waited:
                self.waited[job_id] += 1

    @precondition(lambda self: bool(self.owner))
    @rule(data=st.data(), via=st.integers(0, 1))
    def cancel(self, data: st.DataObject, via: int) -> None:
        job_id = data.draw(st.sampled_from(self._in_order(self.owner)))
        outcome, _snap = on_reactor(self.replicas[via].cancel, job_id)
        if job_id in self.holder:
            assert outcome is CancelOutcome.REQUESTED
            self.flagged.add(job_id)
        else:
            assert outcome is CancelOutcome.CANCELLED
            self._ended(job_id)

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data(), ok=st.booleans())
    def complete(self, data: st.DataObject, ok: bool) -> None:
        job_id = data.draw(st.sampled_from(self._running()))
        store = self.replicas[self.holder[job_id]]
        state = JobState.DONE if ok else JobState.FAILED
        assert on_reactor(store.terminate, job_id, state, result=b"{}", error="x")
        ended = "cancelled" if ok and job_id in self.flagged else state.value
        self._ended(job_id)
        snap = on_reactor(store.snapshot, job_id)
        assert (snap is not None) == (job_id in self.kept)
        assert snap is None or snap.state.value == ended
        self.kept.touch(job_id)

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def hand_back(self, data: st.DataObject) -> None:
        """A stopping replica gives its job back; its stopped run's late end is
        refused."""
        job_id = data.draw(st.sampled_from(self._running()))
        store = self.replicas[self.holder.pop(job_id)]
        assert on_reactor(store.hand_back, job_id)
        assert not on_reactor(store.terminate, job_id, JobState.DONE, result=b"late")
        assert self.fair.requeue(job_id)
        self._queued(job_id)
        self.again.add(job_id)

    @precondition(lambda self: bool(self.holder))
    @rule(data=st.data())
    def lose_lease(self, data: st.DataObject) -> None:
        """The replica running the job is lost (it never renews); the other one's
        upkeep re-queues the job with attempt + 1, or ends it (failed after
        max_attempts, cancelled if its cancel was accepted)."""
        job_id = data.draw(st.sampled_from(self._running()))
        lost = self.holder.pop(job_id)
        on_reactor(self.replicas[lost]._held.pop, job_id)
        other = self.replicas[1 - lost]
        on_reactor(other.link.call, "ZADD", other._prefix + "leases", "XX", 0, job_id)
        on_reactor(_reclaim_now, other)
        if job_id in self.flagged or self.attempt[job_id] >= MAX_ATTEMPTS:
            self._ended(job_id)
        else:
            self.attempt[job_id] += 1
            assert self.fair.requeue(job_id)
            self._queued(job_id)
            self.again.add(job_id)

    @precondition(lambda self: bool(self.known))
    @rule(data=st.data(), via=st.integers(0, 1))
    def poll(self, data: st.DataObject, via: int) -> None:
        """A poll is a use of a finished job (retention's least recently used); a
        pending job's position is the spec's."""
        job_id = data.draw(st.sampled_from(self.known))
        snap = on_reactor(self.replicas[via].snapshot, job_id)
        assert (snap is not None) == (job_id in self.owner or job_id in self.kept)
        if snap is not None:  # a pending job's queue position is the spec's estimate
            assert snap.queue_position == self.fair.position(job_id)
        self.kept.touch(job_id)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def no_caller_above_its_quota(self) -> None:
        view = on_reactor(self.replicas[0].queue_view)
        lines = {line.caller: (line.pending, line.running) for line in view.callers}
        spec = {c: (self.fair.pending_of(c), self.fair.running_of(c)) for c in self.fair.callers()}
        assert lines == spec
        for caller, (pending, running) in lines.items():
            assert pending + running <= self._limit(caller)
        assert view.depth == len(self.owner) <= MAX_QUEUE

    @invariant()
    def nothing_starves(self) -> None:
        for job_id, waited in self.waited.items():
            assert waited <= self.bound[job_id]

    @invariant()
    def retention_keeps_the_specs_jobs(self) -> None:
        page = on_reactor(self.replicas[0].list_jobs, owner=None, states=frozenset(TERMINAL_STATES),
                                              limit=100)  # fmt: skip
        assert {snap.job_id for snap in page.jobs} == {j for j in self.known if j in self.kept}


@pytest_twisted.ensureDeferred
async def test_the_fair_order_quotas_and_retention_hold_on_redis(redis: RedisServer) -> None:
    """Any sequence of admissions, picks on two replicas, cancels, completions,
    hand-backs, lost leases and polls keeps Redis in step with the spec."""
    RedisFairMachine.url = redis.url
    await deferToThread(
        run_state_machine_as_test,
        RedisFairMachine,
        settings=settings(max_examples=100, stateful_step_count=50, deadline=None),
    )
