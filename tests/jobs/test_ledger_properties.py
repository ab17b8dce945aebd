"""Property tests: a hypothesis state machine over the production AsyncJobTable.

The machine keeps a plain model of the ledger (each job's state and payload, the
retention order by completion and by use) and drives the real class with every
public operation: submit, admit with idempotency keys, the transitions, cancel (and
the runner ending a flagged run), set_progress, snapshot, take_request, take_result,
wait, evict_expired and the passage of time on an injected clock.
Each rule checks the answer of the call against the model; the invariants are the
seed's five, as far as each can be observed from one thread:

1. state is readable without the lock: ``state()`` agrees with the locked view;
2. one lock guards payload and state: a view never pairs a state with the wrong
   payload (``done`` has its result, ``failed``/``timeout`` their error, a
   terminal job no request);
3. admission never exceeds ``max_queue``;
4. depth == admitted non-terminal jobs (decremented once; terminal states absorb);
5. retention never evicts a non-terminal job and evicts exactly what TTL-then-LRU
   says (the one lock retention runs under is the only one there is).

Invariants read through calls that do not refresh a job's LRU position
(``state``, ``wait(timeout=0)``, ``nonterminal_ids``, ``len``); reads that do
(``snapshot``, ``take_result``) are rules, so the LRU model sees them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import TERMINAL_STATES, CancelOutcome, JobState
from mortred_twisted.jobs.types import JobSnapshot

MAX_QUEUE = 4
TTL_MS = 5_000
MAX_COMPLETED = 3
WALL_OFFSET = 1_700_000_000.0  # the injected wall clock runs this far ahead
UNKNOWN = "job_never_issued"

END = {"finish": JobState.DONE, "fail": JobState.FAILED, "timeout": JobState.TIMEOUT}


class FakeClock:
    """A hand-stepped clock in seconds (the ledger's injected time source)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class ModelJob:
    """What the specification says the ledger holds for one job."""

    task_id: str
    request: Any
    created_at: float
    state: JobState = JobState.PENDING
    started_at: float | None = None
    completed_at: float | None = None
    result: Any = None
    error: str | None = None
    progress: tuple[int, int] | None = None
    seq: int = 0
    cancel_requested: bool = False
    key: str | None = None
    fingerprint: str = ""


class LedgerMachine(RuleBasedStateMachine):
    """Random interleavings of every ledger operation keep the seed's five invariants."""

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.table: AsyncJobTable[Any] = AsyncJobTable(
            max_queue=MAX_QUEUE,
            job_ttl_ms=TTL_MS,
            max_completed=MAX_COMPLETED,
            clock=self.clock,
            wall_clock=lambda: self.clock.now + WALL_OFFSET,
        )
        self.model: dict[str, ModelJob] = {}
        self.by_completion: OrderedDict[str, float] = OrderedDict()  # terminal jobs
        self.by_use: OrderedDict[str, None] = OrderedDict()  # terminal jobs, LRU first
        self.evicted: set[str] = set()
        self.serial = 0
        self.keys: dict[str, str] = {}  # idempotency key -> job id, while retained

    # -- the model ----------------------------------------------------------------

    def _depth(self) -> int:
        return sum(1 for j in self.model.values() if j.state not in TERMINAL_STATES)

    def _forget(self, job_id: str) -> None:
        assert self.model[job_id].state in TERMINAL_STATES, "the model evicts a live job"
        key = self.model[job_id].key
        if key is not None:
            del self.keys[key]
        del self.model[job_id]
        self.by_completion.pop(job_id, None)
        self.by_use.pop(job_id, None)
        self.evicted.add(job_id)

    def _evict(self) -> set[str]:
        """Retention as specified: TTL after completion first, then LRU over the cap."""
        gone: set[str] = set()
        horizon = self.clock() - TTL_MS / 1000.0
        for job_id, completed_at in list(self.by_completion.items()):
            if completed_at > horizon:
                break
            self._forget(job_id)
            gone.add(job_id)
        while len(self.by_use) > MAX_COMPLETED:
            job_id = next(iter(self.by_use))
            self._forget(job_id)
            gone.add(job_id)
        return gone

    def _touch(self, job_id: str) -> None:
        if job_id in self.by_use:
            self.by_use.move_to_end(job_id)

    def _expected_view(self, job_id: str, snap: JobSnapshot) -> None:
        job = self.model[job_id]
        end = job.completed_at if job.completed_at is not None else self.clock()
        assert snap.job_id == job_id
        assert snap.state is job.state
        assert snap.task_id == job.task_id
        assert snap.error == job.error
        assert snap.progress == job.progress
        assert snap.elapsed_ms == max(0, int((end - job.created_at) * 1000))
        if job.started_at is None:
            assert snap.queued_ms is None
        else:
            assert snap.queued_ms == int((job.started_at - job.created_at) * 1000)
        if job.completed_at is None:
            assert snap.completed_unix is None
        else:
            assert snap.completed_unix == job.completed_at + WALL_OFFSET
        assert snap.cancel_requested == (job.cancel_requested and job.state is JobState.RUNNING)
        if job.state is JobState.PENDING:
            ahead = [
                j for j in self.model.values() if j.state is JobState.PENDING and j.seq < job.seq
            ]
            assert snap.queue_position == len(ahead) + 1, "queue position off"
        else:
            assert snap.queue_position is None

    # -- rules --------------------------------------------------------------------

    @rule(target=jobs)
    def submit(self) -> str:
        """submit() runs retention, then admits below max_queue and refuses at it."""
        self.serial += 1
        task_id, request = f"req-{self.serial}", {"image": f"payload-{self.serial}"}
        gone = self._evict()
        job_id = self.table.submit(request, task_id=task_id)
        for evicted in gone:
            assert self.table.state(evicted) is None, "retention kept an expired job"
        if self._depth() >= MAX_QUEUE:
            assert job_id is None, "admitted past max_queue"
            return UNKNOWN
        assert job_id is not None, "refused below max_queue"
        assert job_id.startswith("job_")
        assert job_id not in self.model and job_id not in self.evicted, "job id reused"
        self.model[job_id] = ModelJob(task_id, request, created_at=self.clock(), seq=self.serial)
        return job_id

    @rule(target=jobs, key=st.sampled_from(["k1", "k2"]), body=st.sampled_from(["a", "b"]))
    def admit_with_key(self, key: str, body: str) -> str:
        """A known key replays its job (same body) or conflicts (other body), even when
        the queue is full; an unknown key admits like submit() and is remembered."""
        self.serial += 1
        gone = self._evict()
        answer = self.table.admit(
            {"body": body}, task_id=f"req-{self.serial}", idempotency_key=key, fingerprint=body
        )
        for evicted in gone:
            assert self.table.state(evicted) is None
        known = self.keys.get(key)
        if known is not None:
            same = self.model[known].fingerprint == body
            assert answer.replayed == same and answer.conflict == (not same)
            assert answer.job_id == (known if same else None)
            if same:
                self._touch(known)
            return UNKNOWN
        assert not answer.replayed and not answer.conflict
        if self._depth() >= MAX_QUEUE:
            assert answer.job_id is None
            return UNKNOWN
        job_id = answer.job_id
        assert job_id is not None and job_id not in self.model and job_id not in self.evicted
        self.model[job_id] = ModelJob(
            f"req-{self.serial}", {"body": body}, created_at=self.clock(), seq=self.serial,
            key=key, fingerprint=body,
        )  # fmt: skip
        self.keys[key] = job_id
        return job_id

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def cancel(self, job_id: str) -> None:
        """A pending job ends cancelled at once; a running one is only flagged; a
        terminal one is left alone; the answer says which."""
        job = self.model.get(job_id)
        outcome, snap = self.table.cancel(job_id)
        if job is None:
            assert outcome is CancelOutcome.UNKNOWN and snap is None
            return
        if job.state is JobState.PENDING:
            assert outcome is CancelOutcome.CANCELLED
            job.state, job.completed_at, job.request = JobState.CANCELLED, self.clock(), None
            job.error = "cancelled by request"
            self.by_completion[job_id] = self.clock()
            self.by_use[job_id] = None
        elif job.state is JobState.RUNNING:
            assert outcome is CancelOutcome.REQUESTED
            job.cancel_requested = True
        else:
            assert outcome is CancelOutcome.FINISHED
        self._touch(job_id)
        assert snap is not None
        self._expected_view(job_id, snap)

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def runner_stops_a_cancelled_run(self, job_id: str) -> None:
        """The runner of a flagged job ends it cancelled (once)."""
        job = self.model.get(job_id)
        ok = self.table.terminate(job_id, JobState.CANCELLED, error="cancelled by request (run)")
        assert ok == (job is not None and job.state not in TERMINAL_STATES)
        if ok:
            assert job is not None
            job.state, job.completed_at, job.request = JobState.CANCELLED, self.clock(), None
            job.error = "cancelled by request (run)"
            self.by_completion[job_id] = self.clock()
            self.by_use[job_id] = None

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def transition_running(self, job_id: str) -> None:
        """Only a pending job may start; the refusal changes nothing."""
        job = self.model.get(job_id)
        ok = self.table.transition_running(job_id)
        assert ok == (job is not None and job.state is JobState.PENDING)
        if ok:
            assert job is not None
            job.state, job.started_at = JobState.RUNNING, self.clock()

    @rule(
        job_id=st.one_of(jobs, st.just(UNKNOWN)),
        how=st.sampled_from(sorted(END)),
        outcome=st.integers(0, 9),
    )
    def terminate(self, job_id: str, how: str, outcome: int) -> None:
        """A job ends once; a second finish/fail/timeout returns False (terminal absorbs)."""
        job = self.model.get(job_id)
        target = END[how]
        payload: Any = {"labels": [outcome]} if how == "finish" else f"{how}-{outcome}"
        ok = getattr(self.table, how)(job_id, payload)
        allowed = job is not None and (
            job.state is JobState.RUNNING
            or (job.state is JobState.PENDING and target is not JobState.DONE)
        )
        assert ok == allowed
        if ok:
            assert job is not None
            job.state, job.completed_at, job.request = target, self.clock(), None
            job.result = payload if target is JobState.DONE else None
            job.error = None if target is JobState.DONE else payload
            self.by_completion[job_id] = self.clock()
            self.by_use[job_id] = None

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)), step=st.integers(0, 50))
    def set_progress(self, job_id: str, step: int) -> None:
        """Progress is recorded for running jobs only."""
        job = self.model.get(job_id)
        ok = self.table.set_progress(job_id, step, 50)
        assert ok == (job is not None and job.state is JobState.RUNNING)
        if ok:
            assert job is not None
            job.progress = (step, 50)

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def snapshot(self, job_id: str) -> None:
        """A poll returns the model's view of a known job and refreshes its LRU place."""
        snap = self.table.snapshot(job_id)
        if job_id not in self.model:
            assert snap is None
            return
        assert snap is not None
        self._expected_view(job_id, snap)
        self._touch(job_id)

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def take_request(self, job_id: str) -> None:
        """take_request moves the payload out once; the task id stays for /result."""
        job = self.model.get(job_id)
        taken = self.table.take_request(job_id)
        if job is None:
            assert taken is None
            return
        assert taken == job.request
        job.request = None
        assert self.table.take_request(job_id) is None, "the payload moved out twice"
        assert self.table.take_result(job_id).task_id == job.task_id
        self._touch(job_id)

    @rule(job_id=st.one_of(jobs, st.just(UNKNOWN)))
    def take_result(self, job_id: str) -> None:
        """/result is 404 unknown, 409 not done, 200 done; asking again answers the same."""
        job = self.model.get(job_id)
        first = self.table.take_result(job_id)
        second = self.table.take_result(job_id)
        assert first == second, "take_result is not repeatable"
        if job is None:
            assert not first.found
            return
        assert first.found and first.state is job.state and first.task_id == job.task_id
        assert first.done == (job.state is JobState.DONE)
        assert first.result == (job.result if job.state is JobState.DONE else None)
        self._touch(job_id)

    @rule(seconds=st.sampled_from([0.0, 0.001, 0.5, 1.0, 2.5, 4.999, 5.0]))
    def advance(self, seconds: float) -> None:
        """Time passes on the injected clock only."""
        self.clock.now += seconds

    @rule()
    def evict_expired(self) -> None:
        """The periodic sweep removes exactly what TTL-then-LRU says, and counts it."""
        gone = self._evict()
        assert self.table.evict_expired() == len(gone)
        for job_id in gone:
            assert self.table.state(job_id) is None

    # -- the five invariants ------------------------------------------------------

    @invariant()
    def state_is_readable_without_the_lock(self) -> None:
        """1. The lock-free state() agrees with the locked view for every job."""
        for job_id, job in self.model.items():
            assert self.table.state(job_id) is job.state
        for job_id in self.evicted | {UNKNOWN}:
            assert self.table.state(job_id) is None

    @invariant()
    def payload_and_state_are_published_together(self) -> None:
        """2. A view never pairs a state with another state's payload."""
        for job_id in self.model:
            snap = self.table.wait(job_id, timeout=0)  # reads under the lock, no LRU touch
            assert snap is not None
            self._expected_view(job_id, snap)
            errored = {JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED}
            assert (snap.error is not None) == (snap.state in errored)

    @invariant()
    def admission_never_exceeds_max_queue(self) -> None:
        """3. Depth stays within [0, max_queue]."""
        assert 0 <= self.table.queue_depth <= MAX_QUEUE

    @invariant()
    def depth_counts_admitted_nonterminal_jobs(self) -> None:
        """4. Depth equals the number of pending + running jobs (decremented once each)."""
        assert self.table.queue_depth == self._depth()

    @invariant()
    def retention_keeps_live_jobs_and_follows_ttl_then_lru(self) -> None:
        """5. Every non-terminal job is kept; the table holds exactly the model's jobs."""
        live = {j for j, job in self.model.items() if job.state not in TERMINAL_STATES}
        assert set(self.table.nonterminal_ids()) == live
        assert len(self.table) == len(self.model)


TestLedgerMachine = LedgerMachine.TestCase
