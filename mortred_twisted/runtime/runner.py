"""The job runner: each admitted job runs as its own Deferred chain (a "series").

Workflow's ``WFGoTask->start()`` on an independent series, in reactor terms. The
route that admitted the job returns its 202 at once; :meth:`JobRunner.start`
schedules the series two reactor turns later (``callLater(0, callLater, 0, …)``)
so the 202's bytes leave in the reactor iteration in between, and the series is
owned by the runner, never reachable from the route's Deferred (Klein cancels
that one when the client disconnects).

The series: acquire a worker within the job's budget (``async_timeout``: worker
wait + run; 0 = unlimited) → ``transition_running`` → ``take_request`` → model
run on the thread pool → ``finish``/``fail``/``timeout`` → ``count_by_name(job_id)``
wakes every waiter. Any exception ends the job ``failed`` with a readable error
and is logged; the ledger's state machine guarantees one terminal transition, so
the queue depth never drifts.

Thread contract: reactor thread only (the model runs on the pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.base import (
    InferenceRequest,
    InputDecodeError,
    Model,
    RunCancelled,
    RunContext,
)
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.execution import EncodedResult, ThreadRunner, run_and_encode
from mortred_twisted.runtime.workers import WorkerLease, WorkerPool

log = Logger()

SHUTDOWN_ERROR = "server shutting down: job abandoned"


def describe_error(exc: BaseException) -> str:
    """A readable one-line error for a job's ``error`` field."""
    if isinstance(exc, InputDecodeError):
        return f"invalid input: {exc}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class JobRunner:
    """Starts, tracks and drains job series."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        ledger: AsyncJobTable[InferenceRequest],
        workers: WorkerPool[Model],
        threads: ThreadRunner,
        counters: NamedCounters,
        metrics: ServerMetrics,
        budget_ms: int,
        on_terminal: Callable[[str], None] | None = None,
    ) -> None:
        self._clock = clock
        self._ledger = ledger
        self._workers = workers
        self._threads = threads
        self._counters = counters
        self._metrics = metrics
        self._budget_s = budget_ms / 1000.0 if budget_ms > 0 else None
        self._on_terminal = on_terminal
        self._inflight: dict[str, Deferred[None]] = {}
        self._contexts: dict[str, RunContext] = {}
        self._draining = False

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def start(self, job_id: str) -> None:
        """Schedule the series of an admitted job (two reactor turns from now)."""
        self._clock.callLater(0, self._clock.callLater, 0, self._begin, job_id)

    def _begin(self, job_id: str) -> None:
        if self._draining:
            self._end(job_id, "fail", SHUTDOWN_ERROR)
            return
        d = Deferred.fromCoroutine(self._series(job_id))
        self._inflight[job_id] = d

        def done(result: Any) -> Any:
            self._inflight.pop(job_id, None)
            return result

        d.addBoth(done)
        d.addErrback(lambda f: log.failure("job {job_id} series crashed", f, job_id=job_id))

    def _remaining(self, deadline: float | None) -> float | None:
        if deadline is None:
            return None
        return deadline - self._clock.seconds()

    async def _series(self, job_id: str) -> None:
        started = self._clock.seconds()
        deadline = None if self._budget_s is None else started + self._budget_s
        try:
            acquire = self._workers.acquire("async")
            lease: WorkerLease[Model] = await within(
                self._clock, acquire, self._remaining(deadline), cancel_on_expiry=True
            )
        except DeadlineExpired:
            self._end(job_id, "timeout", self._budget_message("waiting for a worker"))
            return
        except CancelledError:
            self._end(job_id, "fail", SHUTDOWN_ERROR)
            return
        wait_ms = (self._clock.seconds() - started) * 1000.0
        self._metrics.queue_wait_duration.labels(path="async").observe(wait_ms)
        run: Deferred[EncodedResult] | None = None
        try:
            if not self._ledger.transition_running(job_id):
                return  # already terminal (shutdown ended it while it waited)
            self._metrics.job_events["running"].inc()
            request = self._ledger.take_request(job_id)
            if request is None:
                raise RuntimeError("job payload missing")
            ctx = RunContext(on_progress=lambda step, total: self._progress(job_id, step, total))
            self._contexts[job_id] = ctx
            run = self._threads.run(run_and_encode, lease.worker, request, ctx)
            # The lease goes back when the thread returns, even after a timeout.
            run.addBoth(self._release_after, lease)
            lease = None  # ownership passed to the thread's completion
            result = await within(
                self._clock, run, self._remaining(deadline), cancel_on_expiry=False,
                on_expiry=ctx.cancel,
            )  # fmt: skip
            self._metrics.inference_duration.labels(path="async").observe(result.run_ms)
            self._end(job_id, "finish", result.data_json)
        except DeadlineExpired:
            self._end(job_id, "timeout", self._budget_message("running"))
        except RunCancelled:
            self._end(job_id, "fail", "cancelled")
        except Exception as exc:
            log.failure("job {job_id} failed", job_id=job_id)
            self._end(job_id, "fail", describe_error(exc))
        finally:
            if lease is not None:
                lease.release()
            self._contexts.pop(job_id, None)

    @staticmethod
    def _release_after(result: Any, lease: WorkerLease[Model]) -> Any:
        lease.release()
        return result

    def _progress(self, job_id: str, step: int, total: int) -> None:
        # Called on the worker thread; the ledger is thread-safe.
        self._ledger.set_progress(job_id, step, total)

    def _budget_message(self, phase: str) -> str:
        budget_ms = int((self._budget_s or 0) * 1000)
        return f"job exceeded async_timeout ({budget_ms} ms) while {phase}"

    def _end(self, job_id: str, how: str, payload: Any) -> None:
        """One terminal transition + metrics + wake every waiter of the job."""
        if how == "finish":
            ok, state = self._ledger.finish(job_id, payload), "done"
        elif how == "timeout":
            ok, state = self._ledger.timeout(job_id, payload), "timeout"
        else:
            ok, state = self._ledger.fail(job_id, payload), "failed"
        if not ok:
            return
        self._metrics.job_events[state].inc()
        snap = self._ledger.snapshot(job_id)
        if snap is not None:
            self._metrics.async_job_duration.labels(state=state).observe(snap.elapsed_ms)
        self._counters.count_by_name(job_id, None)
        if self._on_terminal is not None:
            self._on_terminal(job_id)

    def drain(self, grace_s: float) -> Deferred[None]:
        """Stop starting jobs; wait up to ``grace_s`` for in-flight series, then end
        every remaining non-terminal job ``failed`` (waiters are woken)."""
        self._draining = True
        pending = list(self._inflight.values())
        finished: Deferred[Any] = DeferredList(pending, consumeErrors=True)
        timed = within(self._clock, finished, grace_s, cancel_on_expiry=False)

        def abandon(_: Any) -> None:
            for ctx in self._contexts.values():
                ctx.cancel()
            for job_id in self._ledger.nonterminal_ids():
                self._end(job_id, "fail", SHUTDOWN_ERROR)

        timed.addBoth(abandon)
        return timed
