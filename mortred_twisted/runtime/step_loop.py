"""Step batching on the reactor side: one batch loop per step-batching model instance.

A model with ``run_capacity > 1`` offers a :class:`~mortred_twisted.model_api.base.StepBatch`
(the denoising steps of concurrent diffusion jobs, for one): the job runner and the
sync path then call :func:`run_model`, which hands the run to the instance's
:class:`StepLoop` instead of a thread of its own. The loop runs on the model thread
pool (``ThreadRunner.run``, i.e. ``deferToThreadPool``), one call at a time: a call
joins the runs submitted before it (they join at a step boundary, never in the
middle of a step), then advances every run step by step until a run leaves or a new
run is waiting to join, and returns the runs that left; their Deferreds fire on the
reactor, and the next call starts at once. So a newcomer joins at the next step
boundary, while a steady batch costs no reactor round trip per step (on a busy
machine each one waits for the reactor thread to be scheduled). Progress,
cancellation and timeouts are per run and per step inside the call (``RunContext``).
The loop stops when the batch is empty and restarts on the next submit.

Ownership and leases: the Deferred :meth:`StepLoop.submit` returns fires once, when
the run has left the batch (done, failed, cancelled): the worker-pool slot the caller
leased for the run is released then, exactly as after a thread returns; it has no
canceller (stop a run through its ``RunContext``). A crash of the step itself (a bug,
not a run's failure) fails every run in the batch and empties it. Whenever the batch
holds no run while the loop still holds runs it never reported as left (a step that
dropped a cancelled run and then failed), those runs end too, once, with the step's
error (or a ``RuntimeError``), and the loop stops: it never steps an empty batch.

Thread contract: :func:`run_model`, :meth:`StepLoop.submit` and the loop's bookkeeping
run on the reactor thread; :func:`_tick` runs on the model thread pool, one at a time
per loop (the loop awaits each tick before it issues the next), and reads only
:meth:`StepLoop.newcomers_waiting` of the loop (one attribute read). No torch here.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.model_api.base import (
    InferenceRequest,
    Model,
    RunContext,
    StepBatch,
    step_batch_of,
)
from mortred_twisted.runtime.execution import (
    EncodedResult,
    ThreadRunner,
    encode_data,
    run_and_encode,
)

log = Logger()

_loops: weakref.WeakKeyDictionary[StepBatch, StepLoop] = weakref.WeakKeyDictionary()


def run_model(
    threads: ThreadRunner, model: Model, request: InferenceRequest, ctx: RunContext
) -> Deferred[EncodedResult]:
    """Run ``request`` on ``model``: on a thread of its own, or in the model's batch.

    Either way the Deferred fires on the reactor, once, when the run is over (the
    caller releases its worker lease then). The batch loop of an instance is made on
    first use and shared by every caller (jobs and sync requests batch together).
    """
    batch = step_batch_of(model)
    if batch is None:
        return threads.run(run_and_encode, model, request, ctx)
    loop = _loops.get(batch)
    if loop is None:
        loop = _loops[batch] = StepLoop(batch, threads)
    return loop.submit(request, ctx)


@dataclass
class _Entry:
    key: int
    request: InferenceRequest
    ctx: RunContext
    deferred: Deferred[EncodedResult] = field(default_factory=Deferred)


class StepLoop:
    """The batch loop of one :class:`StepBatch` (see the module docstring)."""

    def __init__(self, batch: StepBatch, threads: ThreadRunner) -> None:
        # Weak: the loop is registered under its batch (a WeakKeyDictionary), which
        # it must not keep alive; while runs are in it, their leases hold the model.
        self._batch = weakref.ref(batch)
        self._threads = threads
        self._keys = itertools.count(1)
        self._joining: list[_Entry] = []
        self._running: dict[int, _Entry] = {}
        #: perf_counter at join, per key; written and read on the pool thread only.
        self._joined_at: dict[int, float] = {}
        self._looping = False
        #: Thread calls so far (each one step or more); for tests.
        self.ticks = 0

    @property
    def runs(self) -> int:
        """Runs submitted and not yet left (joining or in the batch)."""
        return len(self._joining) + len(self._running)

    def newcomers_waiting(self) -> bool:
        """Whether runs wait to join (read by the pool thread between two steps)."""
        return bool(self._joining)

    def submit(self, request: InferenceRequest, ctx: RunContext) -> Deferred[EncodedResult]:
        """Add a run; it joins the batch at the next step boundary (reactor thread)."""
        entry = _Entry(next(self._keys), request, ctx)
        self._joining.append(entry)
        if not self._looping:
            self._looping = True
            Deferred.fromCoroutine(self._loop()).addErrback(self._crashed)
        return entry.deferred

    async def _loop(self) -> None:
        try:
            while self._joining or self._running:
                batch = self._batch()
                if batch is None:
                    raise RuntimeError("the model of this batch is gone")
                joining, self._joining = self._joining, []
                for entry in joining:
                    self._running[entry.key] = entry
                left, held, crash = await self._threads.run(
                    _tick, batch, [(e.key, e.request, e.ctx) for e in joining],
                    self._joined_at, self.newcomers_waiting,
                )  # fmt: skip
                self.ticks += 1
                del batch
                for key, outcome in left:
                    entry = self._running.pop(key, None)
                    if entry is None:
                        continue
                    if isinstance(outcome, BaseException):
                        entry.deferred.errback(Failure(outcome))
                    else:
                        entry.deferred.callback(outcome)
                if not held and self._running:
                    self._end_unreported(crash)
        finally:
            self._looping = False

    def _end_unreported(self, crash: BaseException | None) -> None:
        """The batch holds no run, yet runs it never reported as left are still ours
        (a step dropped them, then failed, or a batch lost them): end each once, with
        the step's error if it failed, so no caller waits forever and no empty batch
        is stepped."""
        lost = list(self._running.values())
        self._running.clear()
        log.error(
            "the step batch dropped {n} run(s) without reporting them; they fail", n=len(lost)
        )
        for entry in lost:
            self._joined_at.pop(entry.key, None)
            error = crash or RuntimeError("the step batch dropped this run without reporting it")
            entry.deferred.errback(Failure(error))

    def _crashed(self, failure: Failure) -> None:
        """The loop itself failed: fail every run it held (they are out of the batch)."""
        log.failure("step loop crashed", failure)
        entries = list(self._running.values()) + self._joining
        self._running.clear()
        self._joining = []
        for entry in entries:
            if not entry.deferred.called:
                entry.deferred.errback(failure)


def _tick(
    batch: StepBatch,
    joining: list[tuple[int, InferenceRequest, RunContext]],
    joined_at: dict[int, float],
    newcomers_waiting: Callable[[], bool],
) -> tuple[list[tuple[int, EncodedResult | BaseException]], int, BaseException | None]:
    """Pool-thread body: join the newcomers, step until a run leaves or another run
    waits to join, encode who left. Returns ``(left, held, crash)``: the runs that
    left with their outcome, how many runs the batch still holds, and the error of a
    step that failed (None if none did)."""
    left: list[tuple[int, Any]] = []
    crash: BaseException | None = None
    for key, request, ctx in joining:
        joined_at[key] = time.perf_counter()
        try:
            batch.join(key, request, ctx)
        except Exception as exc:
            left.append((key, exc))
    try:
        while batch.active:
            left.extend(batch.step())
            if left or newcomers_waiting():
                break
    except Exception as exc:
        # Not one run's failure (those are outcomes): the batch's state is unknown.
        log.failure("a step of the batch failed; every run in it fails")
        crash = exc
        left.extend((key, exc) for key in batch.abandon())
    out: list[tuple[int, EncodedResult | BaseException]] = []
    now = time.perf_counter()
    for key, outcome in left:
        started = joined_at.pop(key, now)
        if isinstance(outcome, BaseException):
            out.append((key, outcome))
            continue
        try:
            out.append((key, EncodedResult(encode_data(outcome), (now - started) * 1000.0)))
        except (TypeError, ValueError) as exc:
            out.append((key, exc))
    return out, batch.active, crash
