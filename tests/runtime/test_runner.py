"""JobRunner: job series on a Clock with hand-stepped threads."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.runner import SHUTDOWN_ERROR, JobRunner
from mortred_twisted.runtime.workers import WorkerPool
from mortred_twisted.stores.memory_store import MemoryJobStore
from tests.fakes.threads import HandThreads


class Scripted(Model):
    """Returns {"ok": n} or raises what it is told to; checks cancellation first."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.calls = 0
        self.saw_cancel = False

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        self.calls += 1
        self.saw_cancel = ctx.cancelled
        ctx.progress(1, 1)
        if self.raises is not None:
            raise self.raises
        return {"ok": self.calls}


def setup(model: Model, *, budget_ms: int = 0, workers: int = 1):
    clock, threads = Clock(), HandThreads()
    ledger: AsyncJobTable = AsyncJobTable(max_queue=8)
    pool = WorkerPool([model] * workers)
    counters = NamedCounters()
    runner = JobRunner(
        clock=clock, store=MemoryJobStore(ledger), workers=pool, threads=threads, counters=counters,
        metrics=ServerMetrics(), budget_ms=budget_ms,
    )  # fmt: skip
    return clock, threads, ledger, pool, counters, runner


def admit(ledger: AsyncJobTable, runner: JobRunner) -> str:
    job = ledger.submit(InferenceRequest(req_id="r", images=(b"x",)), task_id="r")
    assert job is not None
    runner.start(job)
    return job


def test_job_runs_to_done_and_wakes_waiters() -> None:
    """A job goes pending→running→done, stores encoded data and wakes its waiters."""
    clock, threads, ledger, pool, counters, runner = setup(Scripted())
    job = admit(ledger, runner)
    woken: list = []
    counters.counter(job).addCallback(woken.append)
    clock.advance(0)
    assert ledger.state(job) is JobState.RUNNING
    threads.step()
    assert ledger.state(job) is JobState.DONE and woken == [job]
    assert ledger.take_result(job).result == b'{"ok":1}'
    assert ledger.queue_depth == 0 and pool.available == 1 and runner.inflight == 0


def test_model_exception_ends_the_job_failed_with_a_readable_error() -> None:
    """An exception in the model ends the job failed; the worker comes back."""
    clock, threads, ledger, pool, _c, runner = setup(Scripted(ValueError("bad pixels")))
    job = admit(ledger, runner)
    clock.advance(0)
    threads.step()
    snap = ledger.snapshot(job)
    assert snap.state is JobState.FAILED and snap.error == "ValueError: bad pixels"
    assert ledger.queue_depth == 0 and pool.available == 1


def test_budget_expiring_while_waiting_for_a_worker_is_timeout() -> None:
    """A job that cannot get a worker within async_timeout ends timeout and leaves the queue."""
    clock, threads, ledger, pool, _c, runner = setup(Scripted(), budget_ms=1000)
    first = admit(ledger, runner)
    second = admit(ledger, runner)
    clock.advance(0)
    assert pool.waiting() == 1
    clock.advance(1.0)
    assert ledger.state(second) is JobState.TIMEOUT
    assert "while waiting for a worker" in ledger.snapshot(second).error
    assert pool.waiting() == 0
    threads.step()
    assert ledger.state(first) is JobState.TIMEOUT  # 1 s passed for it too, while running


def test_budget_expiring_while_running_keeps_the_worker_until_the_thread_returns() -> None:
    """On a run timeout the job ends at once, but the worker is only freed by the thread."""
    model = Scripted()
    clock, threads, ledger, pool, _c, runner = setup(model, budget_ms=500)
    job = admit(ledger, runner)
    clock.advance(0)
    clock.advance(0.5)
    assert ledger.state(job) is JobState.TIMEOUT
    assert pool.available == 0, "the model thread is still running"
    threads.step()
    assert model.saw_cancel, "the run was asked to stop"
    assert pool.available == 1


def test_drain_ends_unstarted_jobs_failed_and_wakes_waiters() -> None:
    """drain(): in-flight jobs get the grace period; the rest end failed with a shutdown error."""
    clock, threads, ledger, pool, counters, runner = setup(Scripted())
    running = admit(ledger, runner)
    queued = admit(ledger, runner)
    clock.advance(0)
    woken: list = []
    counters.counter(queued).addCallback(woken.append)
    drained: list = []
    runner.drain(5.0).addBoth(drained.append)
    clock.advance(5.0)
    assert drained
    assert ledger.state(queued) is JobState.FAILED
    assert ledger.snapshot(queued).error == SHUTDOWN_ERROR
    assert ledger.state(running) is JobState.FAILED
    assert woken == [queued]
    assert ledger.queue_depth == 0
    threads.drain()
    assert pool.available == 1


def test_jobs_started_after_drain_are_refused() -> None:
    """A job whose series would start after drain began ends failed immediately."""
    clock, _threads, ledger, _pool, _c, runner = setup(Scripted())
    runner.drain(1.0)
    job = admit(ledger, runner)
    clock.advance(0)
    assert ledger.state(job) is JobState.FAILED
