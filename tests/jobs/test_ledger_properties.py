"""Property tests: a hypothesis state machine over the production AsyncJobTable.

The model below is the specification (the five invariants, the transition table);
the table under test is the real class.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import TERMINAL_STATES, JobState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LedgerMachine(RuleBasedStateMachine):
    """Random interleavings of submit/transitions/time keep the ledger's contract."""

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.max_queue = 4
        self.ttl_s = 5.0
        self.max_completed = 3
        self.table: AsyncJobTable = AsyncJobTable(
            max_queue=self.max_queue,
            job_ttl_ms=int(self.ttl_s * 1000),
            max_completed=self.max_completed,
            clock=self.clock,
        )
        self.model: dict[str, JobState] = {}
        self.terminated: dict[str, int] = {}
        self.seen_ids: set[str] = set()

    def _expected_depth(self) -> int:
        return sum(1 for s in self.model.values() if s not in TERMINAL_STATES)

    @rule(target=jobs)
    def submit(self) -> str:
        depth_before = self.table.queue_depth
        job = self.table.submit("payload")
        # retention runs on every submit, admitted or not: resync the model
        for known in list(self.model):
            if self.table.state(known) is None:
                assert self.model[known] in TERMINAL_STATES, "a live job was evicted"
                del self.model[known]
        if depth_before >= self.max_queue:
            assert job is None, "admitted past the limit"
            return "job_rejected"
        assert job is not None, "rejected below the limit"
        assert job not in self.seen_ids, "job id reused"
        self.seen_ids.add(job)
        self.model[job] = JobState.PENDING
        return job

    @rule(job=jobs)
    def run(self, job: str) -> None:
        before = self.model.get(job)
        ok = self.table.transition_running(job)
        assert ok == (before is JobState.PENDING)
        if ok:
            self.model[job] = JobState.RUNNING

    @rule(job=jobs, which=st.sampled_from(["finish", "fail", "timeout"]))
    def terminate(self, job: str, which: str) -> None:
        before = self.model.get(job)
        target = {"finish": JobState.DONE, "fail": JobState.FAILED, "timeout": JobState.TIMEOUT}[
            which
        ]
        ok = getattr(self.table, which)(job, "x")
        allowed = before is JobState.RUNNING or (
            before is JobState.PENDING and target is not JobState.DONE
        )
        assert ok == allowed
        if ok:
            self.model[job] = target
            self.terminated[job] = self.terminated.get(job, 0) + 1

    @rule(seconds=st.floats(min_value=0, max_value=4))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @precondition(lambda self: bool(self.model))
    @rule(job=consumes(jobs))
    def read(self, job: str) -> None:
        snap = self.table.snapshot(job)
        if job in self.model:
            assert snap is not None and snap.state is self.model[job]

    @invariant()
    def depth_counts_nonterminal_jobs(self) -> None:
        """Depth == number of admitted non-terminal jobs, within [0, max_queue]."""
        assert self.table.queue_depth == self._expected_depth()
        assert 0 <= self.table.queue_depth <= self.max_queue

    @invariant()
    def every_job_terminated_at_most_once(self) -> None:
        assert all(n == 1 for n in self.terminated.values())

    @invariant()
    def states_match_and_live_jobs_are_kept(self) -> None:
        for job, state in self.model.items():
            assert self.table.state(job) is state

    @invariant()
    def terminal_retention_is_bounded_after_submit(self) -> None:
        """Live jobs are never evicted; terminal ones are bounded by cap+1 between submits."""
        terminal = sum(1 for s in self.model.values() if s in TERMINAL_STATES)
        assert terminal <= self.max_completed + self.max_queue + 1


TestLedgerMachine = LedgerMachine.TestCase
