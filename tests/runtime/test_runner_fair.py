"""JobRunner on a fair store: a free worker takes the job next in fair order (not
the one that asked first), with /infer calls still served in their turn."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.runner import JobRunner
from mortred_twisted.runtime.workers import WorkerPool
from mortred_twisted.stores.memory_store import MemoryJobStore
from tests.fakes.threads import HandThreads


class Echo(Model):
    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        return {"id": request.req_id}


def setup(workers: int = 1, budget_ms: int = 0):
    clock, threads = Clock(), HandThreads()
    ledger: AsyncJobTable = AsyncJobTable(max_queue=1000)
    pool = WorkerPool([Echo()] * workers)
    runner = JobRunner(
        clock=clock, store=MemoryJobStore(ledger), workers=pool, threads=threads,
        counters=NamedCounters(), metrics=ServerMetrics(), budget_ms=budget_ms,
    )  # fmt: skip
    return clock, threads, ledger, pool, runner


def submit(ledger: AsyncJobTable, runner: JobRunner, owner: str, tag: str) -> str:
    admitted = ledger.admit(InferenceRequest(req_id=tag, images=(b"x",)), tag, owner=owner)
    assert admitted.job_id is not None
    runner.start(admitted.job_id)
    return admitted.job_id


def run_all(clock: Clock, threads: HandThreads, ledger: AsyncJobTable) -> list[str]:
    """Step the one worker until nothing is left; the task ids in start order."""
    order = []
    clock.advance(0)
    while threads.pending:
        running = [
            s for s in ledger.list_jobs(owner=None, limit=500).jobs if s.state is JobState.RUNNING
        ]
        order.extend(s.task_id for s in running)
        threads.step()
        clock.advance(0)
    return order


def test_a_small_caller_is_not_stuck_behind_a_flood() -> None:
    """A submits 40 jobs, then B 4 (one worker): B's jobs start within the next
    ten starts instead of after A's 40."""
    clock, threads, ledger, pool, runner = setup()
    for i in range(40):
        submit(ledger, runner, "key:A", f"a{i}")
    clock.advance(0)
    for i in range(4):
        submit(ledger, runner, "key:B", f"b{i}")
    order = run_all(clock, threads, ledger)
    assert len(order) == 44 and order[0] == "a0"
    assert max(order.index(f"b{i}") for i in range(4)) <= 10
    assert ledger.queue_depth == 0 and pool.available == 1 and runner.inflight == 0


def test_a_cancelled_wait_leaves_the_others_in_turn() -> None:
    """Cancelling a waiting job withdraws one pool acquire: the rest still run,
    each once, and every worker comes back."""
    clock, threads, ledger, pool, runner = setup()
    jobs = [submit(ledger, runner, "key:A" if i % 2 else "key:B", f"j{i}") for i in range(6)]
    clock.advance(0)
    ledger.cancel(jobs[3])
    runner.cancel(jobs[3])
    order = run_all(clock, threads, ledger)
    assert sorted(order) == sorted(f"j{i}" for i in range(6) if i != 3)
    assert pool.waiting() == 0 and pool.available == 1 and runner.inflight == 0


def test_a_wait_past_its_budget_ends_timeout_and_the_rest_run() -> None:
    """A job whose async_timeout passes while an /infer call holds the worker ends
    timeout; the worker then goes to the next job in fair order."""
    clock, threads, ledger, pool, runner = setup(budget_ms=1000)
    held = pool.acquire("sync").result
    late = submit(ledger, runner, "key:A", "a0")
    clock.advance(0)
    clock.advance(1.1)
    assert ledger.state(late) is JobState.TIMEOUT
    jobs = [submit(ledger, runner, "key:A", "a1"), submit(ledger, runner, "key:B", "b0")]
    clock.advance(0)
    held.release()
    assert ledger.state(jobs[0]) is JobState.RUNNING
    assert run_all(clock, threads, ledger) == ["a1", "b0"]
    assert pool.available == 1 and pool.waiting() == 0
