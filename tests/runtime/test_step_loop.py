"""Step batching on the reactor side: StepLoop, run_model, slots in the worker pool,
and the job runner / sync path over a scripted step-batching model (hand-stepped
threads, task.Clock)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import (
    InferenceRequest,
    Model,
    RunCancelled,
    RunContext,
    StepBatch,
)
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.inference import SyncInference
from mortred_twisted.runtime.runner import JobRunner
from mortred_twisted.runtime.step_loop import StepLoop, run_model
from mortred_twisted.runtime.workers import WorkerPool
from mortred_twisted.stores.memory_store import MemoryJobStore
from tests.fakes.threads import HandThreads


class CountingBatch(StepBatch):
    """Each run takes ``params.steps`` steps; ``params.fail_at`` makes it raise then.

    Records which keys every step advanced together, like one batched forward.
    """

    def __init__(self) -> None:
        self.runs: dict[int, dict[str, Any]] = {}
        self.forwards: list[list[int]] = []
        self.crash = False

    def join(self, key: int, request: InferenceRequest, ctx: RunContext) -> None:
        ctx.check_cancelled()
        steps = int(request.params.get("steps", 1))
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self.runs[key] = {"req": request, "ctx": ctx, "done": 0, "total": steps}

    def step(self) -> list[tuple[int, Any]]:
        if self.crash:
            raise RuntimeError("the denoiser broke")
        self.forwards.append(sorted(self.runs))
        left: list[tuple[int, Any]] = []
        for key, run in list(self.runs.items()):
            run["done"] += 1
            try:
                if run["req"].params.get("fail_at") == run["done"]:
                    raise FloatingPointError(f"NaN at step {run['done']}")
                run["ctx"].progress(run["done"], run["total"])
                run["ctx"].check_cancelled()
            except Exception as exc:
                del self.runs[key]
                left.append((key, exc))
                continue
            if run["done"] == run["total"]:
                del self.runs[key]
                left.append((key, {"req": run["req"].req_id, "steps": run["done"]}))
        return left

    def abandon(self) -> list[int]:
        keys = list(self.runs)
        self.runs.clear()
        return keys

    @property
    def active(self) -> int:
        return len(self.runs)


class Batched(Model):
    """A step-batching model of capacity ``capacity`` over a :class:`CountingBatch`."""

    def __init__(self, capacity: int = 4) -> None:
        self.run_capacity = capacity
        self.batch = CountingBatch()

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        raise AssertionError("a step-batching model is never run on a thread of its own")

    def step_batch(self) -> StepBatch:
        return self.batch


def request(name: str, **params: Any) -> InferenceRequest:
    return InferenceRequest(req_id=name, images=(b"x",), params=params)


def results(d: Any) -> list[Any]:
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def test_runs_in_the_batch_share_every_step_and_leave_when_done() -> None:
    """The first run starts at once; a second joins at the next step and then advances
    in the same steps; each Deferred fires when its own run is done, with its data."""
    threads, model = HandThreads(), Batched()
    long = results(run_model(threads, model, request("a", steps=3), RunContext()))
    short = results(run_model(threads, model, request("b", steps=1), RunContext()))
    threads.step()
    assert model.batch.forwards == [[1]]
    threads.step()
    assert model.batch.forwards == [[1], [1, 2]]
    assert short[0].data_json == b'{"req":"b","steps":1}' and long == []
    threads.drain()
    assert model.batch.forwards == [[1], [1, 2], [1]]
    assert long[0].data_json == b'{"req":"a","steps":3}'


def test_a_run_submitted_during_a_step_joins_at_the_next_boundary() -> None:
    """A newcomer never enters the step in progress; it joins the one after it, and the
    running run is not held back by it."""
    threads, model = HandThreads(), Batched()
    first = results(run_model(threads, model, request("a", steps=3), RunContext()))
    assert threads.pending == 1  # the first step is under way
    second = results(run_model(threads, model, request("b", steps=1), RunContext()))
    assert threads.pending == 1, "one thread call per step, not one per run"
    threads.step()
    assert model.batch.forwards == [[1]]
    threads.step()
    assert model.batch.forwards == [[1], [1, 2]] and second and not first
    threads.drain()
    assert first and model.batch.forwards[-1] == [1]


def test_progress_is_reported_per_run_per_step() -> None:
    """Each run's context sees its own step and total after every step."""
    threads, model = HandThreads(), Batched()
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    ctx_a = RunContext(lambda s, t: seen["a"].append((s, t)))
    ctx_b = RunContext(lambda s, t: seen["b"].append((s, t)))
    run_model(threads, model, request("a", steps=2), ctx_a)
    run_model(threads, model, request("b", steps=3), ctx_b)
    threads.drain()
    assert seen == {"a": [(1, 2), (2, 2)], "b": [(1, 3), (2, 3), (3, 3)]}


def test_a_cancelled_run_leaves_at_the_next_boundary_and_the_others_go_on() -> None:
    """Cancelling one run ends it with RunCancelled after the current step; its batch
    mates finish normally."""
    threads, model = HandThreads(), Batched()
    ctx = RunContext()
    cancelled = results(run_model(threads, model, request("a", steps=5), ctx))
    other = results(run_model(threads, model, request("b", steps=3), RunContext()))
    threads.step()
    ctx.cancel()
    threads.step()
    assert cancelled and cancelled[0].check(RunCancelled)
    assert model.batch.active == 1 and not other
    threads.drain()
    assert other[0].data_json == b'{"req":"b","steps":3}'


def test_a_failing_run_fails_alone() -> None:
    """A run whose step raises (its scheduler, a NaN) fails with that error; the rest
    of the batch is unaffected."""
    threads, model = HandThreads(), Batched()
    bad = results(run_model(threads, model, request("a", steps=4, fail_at=2), RunContext()))
    good = results(run_model(threads, model, request("b", steps=4), RunContext()))
    threads.drain()
    assert bad[0].check(FloatingPointError)
    assert good[0].data_json == b'{"req":"b","steps":4}'


def test_a_run_that_cannot_join_fails_without_a_step() -> None:
    """A request that join() refuses fails alone; an empty batch then runs no step."""
    threads, model = HandThreads(), Batched()
    refused = results(run_model(threads, model, request("a", steps=0), RunContext()))
    threads.drain()
    assert refused[0].check(ValueError) and model.batch.forwards == []


def test_a_crashing_step_fails_every_run_and_the_loop_recovers() -> None:
    """An error of the step itself (no run's own) fails the whole batch and empties it;
    the next submit starts a fresh loop."""
    threads, model = HandThreads(), Batched()
    a = results(run_model(threads, model, request("a", steps=2), RunContext()))
    b = results(run_model(threads, model, request("b", steps=2), RunContext()))
    model.batch.crash = True
    threads.drain()
    assert a[0].check(RuntimeError) and b[0].check(RuntimeError)
    assert model.batch.active == 0
    model.batch.crash = False
    again = results(run_model(threads, model, request("c", steps=1), RunContext()))
    threads.drain()
    assert again[0].data_json == b'{"req":"c","steps":1}'


class LosingBatch(CountingBatch):
    """A step that drops a cancelled run, then fails in the batched call and loses
    its list of the runs that left (the shape of issue 29's DenoiseBatch bug)."""

    def step(self) -> list[tuple[int, Any]]:
        for key, run in list(self.runs.items()):
            if run["ctx"].cancelled:
                del self.runs[key]  # left, but never reported
        if self.crash:
            raise RuntimeError("the batched denoiser call failed")
        return super().step()


def test_a_step_that_drops_a_run_and_fails_ends_every_run_and_stops() -> None:
    """A run dropped by a step that then fails still ends (once), its mates fail with
    the step's error, and the loop stops instead of stepping an empty batch (before:
    the dropped run's Deferred never fired and the loop ticked on forever)."""
    threads, batch = HandThreads(), LosingBatch()
    loop = StepLoop(batch, threads)
    ctx = RunContext()
    dropped = results(loop.submit(request("a", steps=5), ctx))
    mate = results(loop.submit(request("b", steps=5), RunContext()))
    threads.step()  # both joined: the first step
    ctx.cancel()
    batch.crash = True
    for _ in range(5):  # bounded: the bug kept one thread call queued forever
        if not threads.pending:
            break
        threads.step()
    assert threads.pending == 0 and loop.runs == 0 and loop.ticks <= 3
    assert len(dropped) == 1 and isinstance(dropped[0], Failure)
    assert len(mate) == 1 and mate[0].check(RuntimeError)


def test_a_batch_that_forgets_a_run_ends_it_once_it_is_empty() -> None:
    """A step that drops a run without reporting it (and without failing): the run is
    failed once the batch holds nothing, and no empty batch is stepped."""

    class Forgetful(CountingBatch):
        def step(self) -> list[tuple[int, Any]]:
            self.runs.pop(1, None)  # the first run vanishes
            return super().step()

    threads, batch = HandThreads(), Forgetful()
    loop = StepLoop(batch, threads)
    lost = results(loop.submit(request("a", steps=3), RunContext()))
    threads.step()
    assert threads.pending == 0 and loop.runs == 0 and loop.ticks == 1
    assert lost[0].check(RuntimeError) and "without reporting" in str(lost[0].value)


def test_a_model_of_capacity_one_runs_on_a_thread_of_its_own() -> None:
    """run_model keeps today's path (Model.run on the pool) for ordinary models."""

    class Plain(Model):
        def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
            return {"plain": request.req_id}

    threads = HandThreads()
    out = results(run_model(threads, Plain(), request("p"), RunContext()))
    threads.step()
    assert out[0].data_json == b'{"plain":"p"}'


def test_a_steady_batch_steps_on_without_a_reactor_round_trip() -> None:
    """While no run leaves and none waits to join, one thread call runs step after
    step; a run leaving ends the call (its Deferred fires), and runs counts submitted
    runs until they leave."""
    threads, batch = HandThreads(), CountingBatch()
    loop = StepLoop(batch, threads)
    short = results(loop.submit(request("a", steps=2), RunContext()))
    loop.submit(request("b", steps=5), RunContext())  # joins after the first step
    assert loop.runs == 2
    threads.step()
    assert batch.forwards == [[1]] and loop.ticks == 1
    threads.step()  # b joined; a leaves after its second step
    assert batch.forwards == [[1], [1, 2]] and short and loop.runs == 1
    threads.step()  # b alone: its four remaining steps in one call
    assert batch.forwards[2:] == [[2]] * 4 and loop.ticks == 3 and loop.runs == 0


def test_worker_pool_counts_a_batching_model_as_its_capacity_in_slots() -> None:
    """A worker of run_capacity n is leased n times at once; slots of two workers are
    handed out in turn; ordinary workers stay one slot each."""
    m1, m2 = Batched(capacity=3), Batched(capacity=2)
    pool = WorkerPool([m1, m2])
    assert pool.size == 5 and pool.available == 5
    leases: list = []
    for _ in range(5):
        pool.acquire().addCallback(leases.append)
    assert [lease.worker for lease in leases] == [m1, m2, m1, m2, m1]
    assert pool.busy == 5 and pool.available == 0
    waiting: list = []
    pool.acquire().addCallback(waiting.append)
    assert pool.waiting() == 1
    leases[1].release()
    assert waiting[0].worker is m2
    assert WorkerPool(["w1", "w2"]).size == 2


def runner_setup(capacity: int, budget_ms: int = 0):
    clock, threads = Clock(), HandThreads()
    ledger: AsyncJobTable = AsyncJobTable(max_queue=16)
    model = Batched(capacity=capacity)
    pool = WorkerPool([model])
    runner = JobRunner(
        clock=clock, store=MemoryJobStore(ledger), workers=pool, threads=threads,
        counters=NamedCounters(), metrics=ServerMetrics(), budget_ms=budget_ms,
    )  # fmt: skip
    return clock, threads, ledger, pool, model, runner


def admit(ledger: AsyncJobTable, runner: JobRunner, **params: Any) -> str:
    job = ledger.submit(request("r", **params), task_id="r")
    assert job is not None
    runner.start(job)
    return job


def test_jobs_up_to_the_capacity_run_together_and_the_next_waits_pending() -> None:
    """With capacity 2, two jobs hold the slots and a third stays pending (queue
    position 1) until one of them leaves; it then joins the batch still running."""
    clock, threads, ledger, pool, model, runner = runner_setup(capacity=2)
    a = admit(ledger, runner, steps=1)
    b = admit(ledger, runner, steps=3)
    c = admit(ledger, runner, steps=1)
    clock.advance(0)
    assert ledger.state(a) is JobState.RUNNING and ledger.state(b) is JobState.RUNNING
    snap = ledger.snapshot(c)
    assert snap.state is JobState.PENDING and snap.queue_position == 1
    assert threads.pending == 1
    threads.step()  # a started at once; b joins at the next boundary
    assert ledger.state(a) is JobState.DONE
    assert ledger.state(c) is JobState.RUNNING and pool.busy == 2
    threads.step()
    assert model.batch.forwards == [[1], [2, 3]]
    assert ledger.state(c) is JobState.DONE
    threads.drain()
    assert ledger.state(b) is JobState.DONE and model.batch.forwards[2:] == [[2], [2]]
    assert pool.available == 2 and ledger.queue_depth == 0 and runner.inflight == 0


def test_cancel_of_a_batched_job_frees_its_slot_at_the_next_boundary() -> None:
    """DELETE of a running batched job ends it cancelled after the step in progress;
    the slot comes back then, and its batch mate runs on."""
    clock, threads, ledger, pool, _model, runner = runner_setup(capacity=2)
    a = admit(ledger, runner, steps=5)
    b = admit(ledger, runner, steps=3)
    clock.advance(0)
    threads.step()
    assert ledger.cancel(a) is not None
    assert runner.cancel(a)
    assert ledger.state(a) is JobState.RUNNING and pool.busy == 2
    threads.step()
    assert ledger.state(a) is JobState.CANCELLED and pool.busy == 1
    assert ledger.snapshot(b).progress == (1, 3)
    threads.drain()
    assert ledger.state(b) is JobState.DONE


def test_a_timed_out_batched_job_keeps_its_slot_until_it_has_left_the_batch() -> None:
    """On async_timeout the job ends timeout at once; its slot is freed only once the
    run has left the batch (next boundary), so the batch never holds more than the
    capacity."""
    clock, threads, ledger, pool, model, runner = runner_setup(capacity=2, budget_ms=500)
    job = admit(ledger, runner, steps=10)
    clock.advance(0)
    clock.advance(0.5)
    assert ledger.state(job) is JobState.TIMEOUT and pool.busy == 1
    threads.step()
    assert pool.busy == 0 and model.batch.active == 0


def test_sync_requests_and_jobs_share_the_batch() -> None:
    """A sync request runs in the same steps as a running job (one forward per step)."""
    clock, threads, ledger, pool, model, runner = runner_setup(capacity=4)
    sync = SyncInference(
        clock=clock, workers=pool, threads=threads, metrics=ServerMetrics(),
        run_timeout_ms=0, max_queue_depth=4,
    )  # fmt: skip
    job = admit(ledger, runner, steps=2)
    clock.advance(0)
    answer = results(sync.infer(request("sync", steps=2)))
    threads.drain()
    assert model.batch.forwards == [[1], [1, 2], [2]]
    assert ledger.state(job) is JobState.DONE
    assert answer[0].data_json == b'{"req":"sync","steps":2}'
    assert pool.available == 4


@pytest.mark.parametrize("capacity", [1, 3])
def test_metrics_gauges_follow_the_slots(capacity: int) -> None:
    """workers_available + workers_busy is the capacity (what /metrics reports)."""
    pool = WorkerPool([Batched(capacity=capacity)])
    pool.acquire()
    assert pool.busy == 1 and pool.available == capacity - 1
