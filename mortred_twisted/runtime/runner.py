"""The job runner: each job runs as its own Deferred chain (a "series").

Workflow's ``WFGoTask->start()`` on an independent series, in reactor terms. The
series is owned by the runner, never reachable from the route's Deferred (Klein
cancels that one when the client disconnects). A job reaches the runner in one of
two ways, chosen by the store (:attr:`JobStore.pull`):

- **push** (memory store): the route that admitted the job calls :meth:`start`,
  which schedules the series two reactor turns later (``callLater(0, callLater, 0,
  …)``) so the 202's bytes leave in the iteration in between. The series acquires a
  worker within the job's budget (``async_timeout``: worker wait + run; 0 =
  unlimited), then ``store.begin`` moves it to running and hands out the request.
  With a fair store (``store.next_pending``) the worker a job's wait obtains goes
  to the ready job the store names next in its fair order (callers' weights,
  priority bands), not necessarily to the job that asked first: each waiting job
  holds one acquire in the pool (so async jobs and ``/infer`` calls still share it
  first come, first served), and whichever acquire fires hands its lease out.
- **pull** (a shared store): :meth:`kick` — called on a local submit, on a "queued"
  event from another replica, when a worker comes back and on the maintenance tick
  — takes jobs with ``store.claim_next`` *only while a worker is free*, so no job
  waits on a busy replica while another one idles. The budget counts from
  admission (the claim says how old the job is).

Then: the model runs on the thread pool (a step-batching model: the job joins the
model's batch loop, ``runtime/step_loop.py``) → one ``store.terminate`` (done / failed /
timeout) → ``count_by_name(job_id)`` wakes every local waiter (waiters on other
replicas are woken by the store's events). Any exception ends the job ``failed``
with a readable error and is logged; the store guarantees one terminal transition.

Thread contract: reactor thread only (the model runs on the pool).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, DeferredList, gatherResults
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.store import Claim, JobStore, Maybe, settle, then
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import (
    InferenceRequest,
    InputDecodeError,
    Model,
    RunCancelled,
    RunContext,
)
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.execution import EncodedResult, ThreadRunner
from mortred_twisted.runtime.job_events import JobEvents
from mortred_twisted.runtime.step_loop import run_model
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
    """Starts (push) or takes (pull), tracks and drains job series."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        store: JobStore[InferenceRequest],
        workers: WorkerPool[Model],
        threads: ThreadRunner,
        counters: NamedCounters,
        metrics: ServerMetrics,
        budget_ms: int,
        on_terminal: Callable[[str], None] | None = None,
        events: JobEvents | None = None,
        result_files: Callable[[str, InferenceRequest], Any] | None = None,
    ) -> None:
        self._clock = clock
        #: ``(job_id, request) -> sdk.outputs.FileSink | None`` for each run (None:
        #: every run's files inline); see stores/result_files.py
        self._result_files = result_files
        self._store = store
        self._workers = workers
        self._threads = threads
        self._counters = counters
        self._metrics = metrics
        self._budget_s = budget_ms / 1000.0 if budget_ms > 0 else None
        self._on_terminal = on_terminal
        self._events = events
        self._inflight: dict[str, Deferred[None]] = {}
        self._contexts: dict[str, RunContext] = {}
        self._cancelling: set[str] = set()
        self._awaiting_worker: set[str] = set()  # series waiting for a worker lease
        self._admitted_at: dict[str, float] = {}
        self._draining = False
        self._pulling = False
        self._starting = 0  # claimed jobs not yet holding a worker
        # Push mode on a fair store: jobs waiting for a worker, and one pool acquire
        # per waiting job in the order they were made (the pool fires them FIFO).
        pick = None if store.pull else getattr(store, "next_pending", None)
        self._pick: Callable[[Any], str | None] | None = pick
        self._ready: dict[str, Deferred[WorkerLease[Model]]] = {}
        self._ready_ids: dict[int, str] = {}  # id(a ready job's Deferred) -> job id
        self._acquires: deque[Deferred[WorkerLease[Model]]] = deque()
        if store.pull:
            # A worker coming back (from a job or an /infer call) may take a job.
            workers.on_free = lambda: clock.callLater(0, self.kick)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- cancel -------------------------------------------------------------------

    def cancel(self, job_id: str) -> bool:
        """Stop this process's series of a job the store has cancelled or flagged.

        A running job: its run's cancel flag is set; the model stops at its next
        step boundary (a process worker that ignores it is killed after
        ``cancel_grace_ms``) and the job ends ``cancelled`` (or ``done``/``failed``
        if it finished first). A job still waiting for a worker: the wait is
        cancelled, so it never takes one. False when this process runs no series
        of the job (another replica may).
        """
        ctx = self._contexts.get(job_id)
        if ctx is not None:
            self._cancelling.add(job_id)
            ctx.cancel()
            return True
        series = self._inflight.get(job_id)
        if series is not None and job_id in self._awaiting_worker:
            self._cancelling.add(job_id)
            series.cancel()
            return True
        # Past its run (its terminal write is under way: cancelling the series would
        # cancel that write) or not here at all.
        return series is not None

    # -- push ---------------------------------------------------------------------

    def start(self, job_id: str) -> None:
        """Push mode: schedule the series of an admitted job (two reactor turns on)."""
        self._clock.callLater(0, self._clock.callLater, 0, self._begin, job_id)

    def _begin(self, job_id: str) -> None:
        if self._draining:
            self._end(job_id, JobState.FAILED, SHUTDOWN_ERROR)
            return
        self._track(job_id, Deferred.fromCoroutine(self._push_series(job_id)))

    def _track(self, job_id: str, d: Deferred[None]) -> None:
        self._inflight[job_id] = d

        def done(result: Any) -> Any:
            self._inflight.pop(job_id, None)
            self._admitted_at.pop(job_id, None)
            return result

        d.addBoth(done)
        d.addErrback(lambda f: log.failure("job {job_id} series crashed", f, job_id=job_id))

    def _remaining(self, deadline: float | None) -> float | None:
        if deadline is None:
            return None
        return deadline - self._clock.seconds()

    async def _push_series(self, job_id: str) -> None:
        started = self._clock.seconds()
        self._admitted_at[job_id] = started
        deadline = None if self._budget_s is None else started + self._budget_s
        self._awaiting_worker.add(job_id)
        try:
            acquire = self._acquire_in_turn(job_id)
            lease: WorkerLease[Model] = await within(
                self._clock, acquire, self._remaining(deadline), cancel_on_expiry=True
            )
            self._awaiting_worker.discard(job_id)
        except DeadlineExpired:
            self._awaiting_worker.discard(job_id)
            await settle(self._end(job_id, JobState.TIMEOUT, self._budget_message("waiting")))
            return
        except CancelledError:
            self._awaiting_worker.discard(job_id)
            if job_id in self._cancelling:  # the store has ended it cancelled already
                self._cancelling.discard(job_id)
                return
            await settle(self._end(job_id, JobState.FAILED, SHUTDOWN_ERROR))
            return
        wait_ms = (self._clock.seconds() - started) * 1000.0
        self._metrics.queue_wait_by_path["async"].observe(wait_ms)
        try:
            request = await settle(self._store.begin(job_id))
        except BaseException:
            lease.release()
            raise
        if request is None:
            lease.release()
            return  # already terminal (shutdown ended it while it waited)
        await self._run(job_id, lease, request, deadline)

    def _acquire_in_turn(self, job_id: str) -> Deferred[WorkerLease[Model]]:
        """A worker for ``job_id`` when its turn in the store's fair order comes
        (plain FIFO without a fair store). Cancelling the Deferred gives up the
        wait and withdraws the newest pool acquire (the others keep their place)."""
        acquire = self._workers.acquire("async")
        if self._pick is None or (acquire.called and not self._ready):
            return acquire  # plain FIFO, or a free worker and no job of ours waiting

        mine: Deferred[WorkerLease[Model]] = Deferred(self._give_up)
        self._ready[job_id] = mine
        self._ready_ids[id(mine)] = job_id
        self._acquires.append(acquire)
        acquire.addCallbacks(self._hand_out, _withdrawn)
        return mine

    def _give_up(self, mine: Deferred[WorkerLease[Model]]) -> None:
        """A ready job's wait was cancelled (its budget, a cancel, shutdown): forget
        it and withdraw the newest pool acquire. One bound method for every job (no
        closure per pending job: a backlog's objects are scanned by every full GC)."""
        job_id = self._ready_ids.pop(id(mine), None)
        if job_id is not None and self._ready.pop(job_id, None) is not None and self._acquires:
            self._acquires.pop().cancel()

    def _hand_out(self, lease: WorkerLease[Model]) -> None:
        """A pool acquire fired (the oldest outstanding one): its lease goes to the
        ready job that starts next in fair order."""
        self._acquires.popleft()
        assert self._pick is not None
        job_id = self._pick(self._ready)
        if job_id is None:  # none of them is pending any more: the oldest ends it
            job_id = next(iter(self._ready), None)
        if job_id is None:
            lease.release()
            return
        mine = self._ready.pop(job_id)
        del self._ready_ids[id(mine)]
        mine.callback(lease)

    # -- pull ---------------------------------------------------------------------

    def kick(self) -> None:
        """Pull mode: take pending jobs while a worker is free (no-op in push mode,
        while draining, or while a pull is already under way)."""
        if not self._store.pull or self._draining or self._pulling:
            return
        if self._workers.available <= self._starting:
            return  # no free worker: every "queued" event of a busy replica ends here
        self._pulling = True
        d = Deferred.fromCoroutine(self._pull())
        d.addErrback(lambda f: log.failure("pulling jobs failed", f))

    async def _pull(self) -> None:
        try:
            # No lease is held while asking the store: the sync path keeps every
            # free worker meanwhile; a claimed job then takes the next free one.
            while not self._draining and self._workers.available > self._starting:
                try:
                    claim = await settle(self._store.claim_next())
                except Exception as exc:
                    log.warn("cannot take jobs from the store: {e}", e=describe_error(exc))
                    return
                if claim is None:
                    return
                self._starting += 1
                self._track(claim.job_id, Deferred.fromCoroutine(self._pull_series(claim)))
        finally:
            self._pulling = False

    async def _pull_series(self, claim: Claim) -> None:
        job_id = claim.job_id
        now = self._clock.seconds()
        admitted = self._admitted_at[job_id] = now - claim.age_ms / 1000.0
        deadline = None if self._budget_s is None else admitted + self._budget_s
        self._awaiting_worker.add(job_id)
        try:
            acquire = self._workers.acquire("async")
            lease: WorkerLease[Model] = await within(
                self._clock, acquire, self._remaining(deadline), cancel_on_expiry=True
            )
            self._awaiting_worker.discard(job_id)
        except DeadlineExpired:
            self._awaiting_worker.discard(job_id)
            await settle(self._end(job_id, JobState.TIMEOUT, self._budget_message("waiting")))
            return
        except CancelledError:
            self._awaiting_worker.discard(job_id)
            if job_id in self._cancelling:
                # Claimed (running in the store) but still waiting for a worker here:
                # a cancel ends it now; handing it back would let it run elsewhere.
                self._cancelling.discard(job_id)
                await settle(self._end(job_id, JobState.CANCELLED, "cancelled by request"))
            else:
                await settle(self._store.hand_back(job_id))
            return
        finally:
            self._starting -= 1
        wait_ms = (self._clock.seconds() - admitted) * 1000.0
        self._metrics.queue_wait_by_path["async"].observe(wait_ms)
        await self._run(job_id, lease, claim.request, deadline)

    # -- the common part ----------------------------------------------------------

    async def _run(
        self,
        job_id: str,
        lease: WorkerLease[Model] | None,
        request: InferenceRequest,
        deadline: float | None,
    ) -> None:
        """Run the model for a running job whose worker is ``lease``; end the job."""
        assert lease is not None
        run: Deferred[EncodedResult] | None = None
        outcome: tuple[JobState, Any]
        try:
            self._metrics.job_events["running"].inc()
            if self._events is not None:
                self._events.started(job_id)
            ctx = RunContext(on_progress=lambda step, total: self._progress(job_id, step, total))
            ctx.job_id = job_id
            if self._result_files is not None:
                ctx.result_files = self._result_files(job_id, request)
            if self._events is not None:  # an SDK model's previews and streamed outputs
                ctx.on_event = lambda name, data: self._events.emitted(job_id, name, data)
            self._contexts[job_id] = ctx
            run = run_model(self._threads, lease.worker, request, ctx)
            # The lease goes back when the run is over (its thread returned, or it
            # left the model's batch), even after a timeout.
            run.addBoth(self._release_after, lease)
            lease = None  # ownership passed to the thread's completion
            result = await within(
                self._clock, run, self._remaining(deadline), cancel_on_expiry=False,
                on_expiry=ctx.cancel,
            )  # fmt: skip
            self._metrics.inference_by_path["async"].observe(result.run_ms)
            if job_id in self._cancelling:
                # The cancel was accepted before the run came back: it never ends done
                # (a shared store would refuse it too; see TERMINATE).
                outcome = (JobState.CANCELLED, "cancelled by request (the run finished first)")
            else:
                outcome = (JobState.DONE, result.data_json)
        except DeadlineExpired:
            outcome = (JobState.TIMEOUT, self._budget_message("running"))
        except RunCancelled as exc:
            if job_id in self._cancelling:
                outcome = (JobState.CANCELLED, f"cancelled by request ({exc})")
            else:
                outcome = (JobState.FAILED, "cancelled")
        except Exception as exc:
            log.failure("job {job_id} failed", job_id=job_id)
            outcome = (JobState.FAILED, describe_error(exc))
        finally:
            if lease is not None:
                lease.release()
            self._contexts.pop(job_id, None)
            self._cancelling.discard(job_id)
        await settle(self._end(job_id, *outcome))

    @staticmethod
    def _release_after(result: Any, lease: WorkerLease[Model]) -> Any:
        lease.release()
        return result

    def _progress(self, job_id: str, step: int, total: int) -> None:
        # Called on the worker thread at each step boundary; set_progress is
        # thread-safe by contract. A shared store's (coalesced) progress write reads
        # the job's cancel flag back and stops the run through ``cancel`` when set:
        # the step-boundary read of a cancel whose announcement was lost.
        self._store.set_progress(job_id, step, total)
        if self._events is not None:
            self._events.progress(job_id, step, total)

    def _budget_message(self, phase: str) -> str:
        budget_ms = int((self._budget_s or 0) * 1000)
        phase = "waiting for a worker" if phase == "waiting" else phase
        return f"job exceeded async_timeout ({budget_ms} ms) while {phase}"

    def _end(self, job_id: str, state: JobState, payload: Any) -> Maybe[None]:
        """One terminal transition + metrics + wake every local waiter of the job.
        Counted in the state the job ended in: a shared store ends a job whose cancel
        was accepted ``cancelled`` even when this run asked for ``done``."""
        if state is JobState.DONE:
            ended = self._store.terminate(job_id, state, result=payload)
        else:
            ended = self._store.terminate(job_id, state, error=payload)
        admitted = self._admitted_at.get(job_id)
        now = self._clock.seconds()

        def after(final: JobState | None) -> None:
            if final is None:
                return
            elapsed_ms = None if admitted is None else (now - admitted) * 1000.0
            record_end(
                job_id, final, store=self._store, metrics=self._metrics,
                counters=self._counters, events=self._events, elapsed_ms=elapsed_ms,
            )  # fmt: skip
            if self._on_terminal is not None:
                self._on_terminal(job_id)

        return then(ended, after)

    # -- shutdown -----------------------------------------------------------------

    def drain(self, grace_s: float) -> Deferred[None]:
        """Stop starting jobs; wait up to ``grace_s`` for in-flight series; then ask
        the models still running to stop, hand jobs of a shared store back to its
        queue (another replica runs them), and end every job that dies with this
        process ``failed`` (waiters are woken)."""
        self._draining = True
        pending = list(self._inflight.values())
        finished: Deferred[Any] = DeferredList(pending, consumeErrors=True)
        timed = within(self._clock, finished, grace_s, cancel_on_expiry=False)

        def abandon(_: Any) -> Deferred[Any]:
            for ctx in self._contexts.values():
                ctx.cancel()
            steps: list[Deferred[Any]] = []
            for job_id in list(self._inflight):
                steps.append(_as_deferred(self._store.hand_back(job_id)))

            def end_orphans(ids: list[str]) -> Deferred[Any]:
                ends = [_as_deferred(self._end(j, JobState.FAILED, SHUTDOWN_ERROR)) for j in ids]
                return gatherResults(ends, consumeErrors=True)

            orphans = _as_deferred(self._store.orphaned_at_shutdown()).addCallback(end_orphans)
            steps.append(orphans)
            out = gatherResults(steps, consumeErrors=True)
            out.addErrback(lambda f: log.failure("ending jobs at shutdown failed", f))
            return out

        timed.addBoth(abandon)
        return timed


def record_end(
    job_id: str,
    state: JobState,
    *,
    store: JobStore[Any],
    metrics: ServerMetrics,
    counters: NamedCounters,
    events: JobEvents | None,
    elapsed_ms: float | None = None,
) -> None:
    """The side effects of one terminal transition, for whoever made it (the runner,
    or a shared store's upkeep or claim through ``on_ended``): count it in
    ``mortred_async_jobs_total`` and its duration (read from the job when
    ``elapsed_ms`` is None), wake the job's local waiters and event streams, send its
    ``completed`` webhook. Call it exactly once per job. Reactor thread."""
    metrics.job_events[state.value].inc()
    duration = metrics.job_duration_by_state[state.value]
    if elapsed_ms is not None:
        duration.observe(elapsed_ms)
    else:
        read = then(store.snapshot(job_id), lambda s: duration.observe(s.elapsed_ms) if s else None)
        add_errback = getattr(read, "addErrback", None)
        if add_errback is not None:
            add_errback(lambda _f: None)  # a duration sample is not worth a retry
    counters.count_by_name(job_id, None)
    if events is not None:
        events.ended(job_id)


def _withdrawn(failure: Any) -> None:
    """A pool acquire withdrawn by :meth:`JobRunner._give_up` (cancelled)."""
    failure.trap(CancelledError)


def _as_deferred(value: Any) -> Deferred[Any]:
    if isinstance(value, Deferred):
        return value
    d: Deferred[Any] = Deferred()
    d.callback(value)
    return d
