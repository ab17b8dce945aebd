"""Unit tests of the production AsyncJobTable (never a re-implementation)."""

from __future__ import annotations

import threading

import pytest

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import TERMINAL_STATES, JobState


class FakeClock:
    """A hand-stepped monotonic clock in seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_table(**kw) -> AsyncJobTable:
    kw.setdefault("max_queue", 8)
    return AsyncJobTable(**kw)


def test_submit_returns_unique_job_ids_with_prefix() -> None:
    """submit() hands out distinct ids that start with job_."""
    table = make_table(max_queue=100)
    ids = {table.submit({"n": i}) for i in range(50)}
    assert len(ids) == 50
    assert all(i is not None and i.startswith("job_") for i in ids)


def test_new_job_is_pending_and_counts_in_depth() -> None:
    """A submitted job is pending and occupies one unit of queue depth."""
    table = make_table()
    job = table.submit("req", task_id="r1")
    assert table.state(job) is JobState.PENDING
    assert table.queue_depth == 1
    snap = table.snapshot(job)
    assert snap is not None and snap.task_id == "r1" and snap.error is None


def test_admission_is_exact_at_the_limit() -> None:
    """Exactly max_queue jobs are admitted; the next submit is rejected."""
    table = make_table(max_queue=3)
    assert all(table.submit(i) for i in range(3))
    assert table.submit("overflow") is None
    assert table.queue_depth == 3


@pytest.mark.parametrize("limit", [0, -1])
def test_nonpositive_max_queue_admits_nothing(limit: int) -> None:
    """async_max_queue <= 0 admits nothing."""
    table = make_table(max_queue=limit)
    assert table.submit("x") is None
    assert table.queue_depth == 0


def test_terminal_transition_frees_one_slot() -> None:
    """A job reaching a terminal state frees its slot for the next submit."""
    table = make_table(max_queue=1)
    job = table.submit("a")
    assert table.submit("b") is None
    assert table.transition_running(job)
    assert table.finish(job, {"ok": 1})
    assert table.queue_depth == 0
    assert table.submit("b") is not None


def test_only_pending_may_enter_running() -> None:
    """transition_running succeeds once, from pending only."""
    table = make_table()
    job = table.submit("a")
    assert table.transition_running(job)
    assert not table.transition_running(job)
    assert table.state(job) is JobState.RUNNING


def test_finish_from_pending_is_refused() -> None:
    """A pending job cannot be done without running first."""
    table = make_table()
    job = table.submit("a")
    assert not table.finish(job, "r")
    assert table.state(job) is JobState.PENDING
    assert table.queue_depth == 1


@pytest.mark.parametrize("start_running", [False, True])
@pytest.mark.parametrize("method", ["fail", "timeout"])
def test_any_nonterminal_may_fail_or_time_out(start_running: bool, method: str) -> None:
    """fail() and timeout() work from pending and from running, and record the error."""
    table = make_table()
    job = table.submit("a")
    if start_running:
        table.transition_running(job)
    assert getattr(table, method)(job, "boom")
    snap = table.snapshot(job)
    assert snap is not None
    assert snap.state is {"fail": JobState.FAILED, "timeout": JobState.TIMEOUT}[method]
    assert snap.error == "boom"
    assert table.queue_depth == 0


@pytest.mark.parametrize("terminal", ["finish", "fail", "timeout"])
def test_terminal_states_absorb(terminal: str) -> None:
    """Every transition out of a terminal state returns False and leaves depth unchanged."""
    table = make_table()
    job = table.submit("a")
    table.transition_running(job)
    assert getattr(table, terminal)(job, "x")
    state = table.state(job)
    assert state in TERMINAL_STATES
    depth = table.queue_depth
    assert not table.transition_running(job)
    assert not table.finish(job, "y")
    assert not table.fail(job, "y")
    assert not table.timeout(job, "y")
    assert table.state(job) is state
    assert table.queue_depth == depth


def test_transitions_on_unknown_id_return_false() -> None:
    """Unknown ids are refused by every transition and read as None / not found."""
    table = make_table()
    assert not table.transition_running("job_x")
    assert not table.finish("job_x", 1)
    assert not table.fail("job_x", "e")
    assert not table.timeout("job_x", "e")
    assert table.snapshot("job_x") is None
    assert table.state("job_x") is None
    assert not table.take_result("job_x").found


def test_take_request_moves_payload_once_and_keeps_task_id() -> None:
    """take_request() returns the payload once; the result still echoes the task id."""
    table = make_table()
    job = table.submit({"images": ["big"]}, task_id="req-7")
    assert table.take_request(job) == {"images": ["big"]}
    assert table.take_request(job) is None
    table.transition_running(job)
    table.finish(job, {"answer": 42})
    lookup = table.take_result(job)
    assert lookup.done and lookup.task_id == "req-7" and lookup.result == {"answer": 42}


def test_take_result_semantics_and_repeatability() -> None:
    """take_result: not done while pending/running/failed; done is repeatable."""
    table = make_table()
    job = table.submit("a", task_id="t")
    assert table.take_result(job).state is JobState.PENDING
    table.transition_running(job)
    assert not table.take_result(job).done
    table.finish(job, "R")
    first, second = table.take_result(job), table.take_result(job)
    assert first.done and second.done and first.result == second.result == "R"
    failed = table.submit("b")
    table.fail(failed, "bad")
    lookup = table.take_result(failed)
    assert lookup.found and not lookup.done and lookup.state is JobState.FAILED


def test_elapsed_ms_grows_then_freezes_at_completion() -> None:
    """elapsed_ms increases while running and freezes once terminal."""
    clock = FakeClock()
    table = make_table(clock=clock)
    job = table.submit("a")
    clock.advance(0.25)
    table.transition_running(job)
    clock.advance(0.5)
    assert table.snapshot(job).elapsed_ms == 750
    table.finish(job, 1)
    clock.advance(10)
    snap = table.snapshot(job)
    assert snap.elapsed_ms == 750 and snap.queued_ms == 250


def test_ttl_evicts_completed_jobs_on_submit() -> None:
    """A terminal job older than the TTL is gone after the next submit; a fresh one stays."""
    clock = FakeClock()
    table = make_table(clock=clock, job_ttl_ms=1000, max_completed=100)
    old = table.submit("old")
    table.fail(old, "e")
    clock.advance(0.6)
    young = table.submit("young")
    table.fail(young, "e")
    clock.advance(0.5)  # old is 1.1 s past completion, young 0.5 s
    table.submit("trigger")
    assert table.snapshot(old) is None
    assert table.snapshot(young) is not None


def test_ttl_never_evicts_running_jobs() -> None:
    """Pending and running jobs survive any amount of time and LRU pressure."""
    clock = FakeClock()
    table = make_table(clock=clock, job_ttl_ms=10, max_completed=0, max_queue=10)
    pending = table.submit("p")
    running = table.submit("r")
    table.transition_running(running)
    clock.advance(3600)
    for _ in range(5):
        job = table.submit("x")
        table.fail(job, "e")
    assert table.state(pending) is JobState.PENDING
    assert table.state(running) is JobState.RUNNING


def test_lru_evicts_least_recently_used_beyond_cap() -> None:
    """Beyond max_completed, the least recently used terminal job goes first."""
    clock = FakeClock()
    table = make_table(clock=clock, job_ttl_ms=0, max_completed=2, max_queue=10)
    a, b = table.submit("a"), table.submit("b")
    table.fail(a, "e")
    table.fail(b, "e")
    table.snapshot(a)  # a is now more recently used than b
    c = table.submit("c")
    table.fail(c, "e")
    table.submit("trigger")  # three terminal jobs, cap 2: evict b
    assert table.snapshot(b) is None
    assert table.snapshot(a) is not None and table.snapshot(c) is not None


def test_job_finished_after_long_run_is_still_evictable() -> None:
    """A job that was running during earlier evictions is evicted later (the C++ defect)."""
    clock = FakeClock()
    table = make_table(clock=clock, job_ttl_ms=1000, max_completed=100, max_queue=10)
    long_job = table.submit("long")
    table.transition_running(long_job)
    clock.advance(5)
    table.submit("x")  # eviction pass while long_job is running
    table.finish(long_job, "r")
    clock.advance(2)
    table.submit("y")
    assert table.snapshot(long_job) is None


def test_wait_returns_at_terminal_from_another_thread() -> None:
    """wait() wakes when another thread finishes the job."""
    table = make_table()
    job = table.submit("a")
    started = threading.Event()

    def finisher() -> None:
        started.wait(5)
        table.transition_running(job)
        table.finish(job, "r")

    t = threading.Thread(target=finisher)
    t.start()
    started.set()
    snap = table.wait(job, timeout=10)
    t.join(5)
    assert snap is not None and snap.state is JobState.DONE


def test_wait_budget_expiry_returns_nonterminal_state() -> None:
    """wait() with a small budget returns the current non-terminal state."""
    table = make_table()
    job = table.submit("a")
    snap = table.wait(job, timeout=0.01)
    assert snap is not None and snap.state is JobState.PENDING
    assert table.wait("job_unknown", timeout=0.01) is None


def test_progress_recorded_only_while_running() -> None:
    """set_progress is accepted while running and shows in snapshots."""
    table = make_table()
    job = table.submit("a")
    assert not table.set_progress(job, 1, 10)
    table.transition_running(job)
    assert table.set_progress(job, 3, 10)
    assert table.snapshot(job).progress == (3, 10)
    table.finish(job, 1)
    assert not table.set_progress(job, 4, 10)


def test_evict_expired_frees_jobs_without_a_submit() -> None:
    """The periodic sweep applies the same TTL as submit, and only to terminal jobs."""
    clock = FakeClock()
    table = make_table(clock=clock, job_ttl_ms=1000, max_completed=100)
    done = table.submit("done")
    assert table.transition_running(done) and table.finish(done, 1)
    running = table.submit("running")
    table.transition_running(running)
    clock.advance(0.9)
    assert table.evict_expired() == 0 and table.snapshot(done) is not None
    clock.advance(0.2)
    assert table.evict_expired() == 1
    assert table.snapshot(done) is None and table.snapshot(running) is not None
