"""The sync inference path (``POST <server_uri>``), with optional dynamic batching.

One request: backpressure check (``max_queue_depth`` sync requests may wait for a
worker; beyond that :class:`QueueFull` → 429) → acquire a worker from the pool
shared with the job runner → run on the model thread pool → encoded result. The
``model_run_timeout`` budget covers worker wait + run (:class:`RunTimeout` → 504).

With ``max_batch_size > 1`` requests are gathered by a :class:`Batcher`: when a
worker is free it waits up to ``max_batch_delay_ms`` for more requests, then runs
up to ``max_batch_size`` of them in one ``Model.run_batch`` call; each request gets
its own result or error (a bad image fails alone).

Client disconnect: cancelling the Deferred returned by :meth:`SyncInference.infer`
releases what the request held: a queued request leaves the queue; a running one
has its cancellation flag set, and its worker returns to the pool when the model
thread returns (never earlier, so the pool is never oversubscribed).

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.execution import (
    EncodedResult,
    ThreadRunner,
    run_batch_and_encode,
)
from mortred_twisted.runtime.step_loop import run_model
from mortred_twisted.runtime.workers import WorkerLease, WorkerPool


class QueueFull(Exception):
    """Sync backpressure: too many requests are already waiting (429)."""


class RunTimeout(Exception):
    """``model_run_timeout`` expired (worker wait + run) (504)."""


class _Item:
    __slots__ = ("ctx", "deferred", "request")

    def __init__(self, request: InferenceRequest, ctx: RunContext) -> None:
        self.request = request
        self.ctx = ctx
        self.deferred: Deferred[EncodedResult] = Deferred(self._cancel)

    def _cancel(self, _d: Deferred[Any]) -> None:
        self.ctx.cancel()


class Batcher:
    """Gathers sync requests into ``Model.run_batch`` calls (see module docstring)."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        workers: WorkerPool[Model],
        threads: ThreadRunner,
        metrics: ServerMetrics,
        max_batch_size: int,
        max_batch_delay_ms: float,
    ) -> None:
        self._clock = clock
        self._workers = workers
        self._threads = threads
        self._metrics = metrics
        self._max = max_batch_size
        self._delay_s = max_batch_delay_ms / 1000.0
        self._pending: deque[_Item] = deque()
        self._collecting = False

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def submit(self, request: InferenceRequest, ctx: RunContext) -> Deferred[EncodedResult]:
        item = _Item(request, ctx)
        self._pending.append(item)
        if not self._collecting:
            self._collecting = True
            Deferred.fromCoroutine(self._collect()).addErrback(self._crashed)
        return item.deferred

    def _crashed(self, failure: Any) -> None:
        self._collecting = False
        while self._pending:
            item = self._pending.popleft()
            if not item.deferred.called:
                item.deferred.errback(failure)

    async def _collect(self) -> None:
        try:
            while self._live_pending():
                lease: WorkerLease[Model] = await self._workers.acquire("sync")
                if self._delay_s > 0 and len(self._pending) < self._max:
                    await deferLater(self._clock, self._delay_s, lambda: None)
                batch = self._take_batch()
                if not batch:
                    lease.release()
                    continue
                self._dispatch(lease, batch)
        finally:
            self._collecting = False

    def _live_pending(self) -> bool:
        while self._pending and self._pending[0].deferred.called:
            self._pending.popleft()  # cancelled while queued
        return bool(self._pending)

    def _take_batch(self) -> list[_Item]:
        batch: list[_Item] = []
        while self._pending and len(batch) < self._max:
            item = self._pending.popleft()
            if not item.deferred.called:
                batch.append(item)
        return batch

    def _dispatch(self, lease: WorkerLease[Model], batch: list[_Item]) -> None:
        run = self._threads.run(
            run_batch_and_encode,
            lease.worker,
            [item.request for item in batch],
            [item.ctx for item in batch],
        )

        def deliver(outputs: list[EncodedResult | BaseException]) -> None:
            lease.release()
            for item, out in zip(batch, outputs, strict=True):
                if item.deferred.called:
                    continue
                if isinstance(out, BaseException):
                    item.deferred.errback(out)
                else:
                    item.deferred.callback(out)

        def crashed(failure: Any) -> None:
            lease.release()
            for item in batch:
                if not item.deferred.called:
                    item.deferred.errback(failure)

        run.addCallbacks(deliver, crashed)


class SyncInference:
    """The sync path's runtime: backpressure, worker arbitration, timeout, batching."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        workers: WorkerPool[Model],
        threads: ThreadRunner,
        metrics: ServerMetrics,
        run_timeout_ms: int,
        max_queue_depth: int,
        max_batch_size: int = 1,
        max_batch_delay_ms: float = 0.0,
    ) -> None:
        self._clock = clock
        self._workers = workers
        self._threads = threads
        self._metrics = metrics
        self._timeout_s = run_timeout_ms / 1000.0 if run_timeout_ms > 0 else None
        self._max_queue_depth = max_queue_depth
        self._batcher: Batcher | None = None
        if max_batch_size > 1:
            self._batcher = Batcher(
                clock=clock,
                workers=workers,
                threads=threads,
                metrics=metrics,
                max_batch_size=max_batch_size,
                max_batch_delay_ms=max_batch_delay_ms,
            )

    @property
    def waiting(self) -> int:
        """Sync requests queued for a worker (the backpressure measure)."""
        if self._batcher is not None:
            return self._batcher.waiting
        return self._workers.waiting("sync")

    def infer(self, request: InferenceRequest) -> Deferred[EncodedResult]:
        """Run ``request``; fails with QueueFull, RunTimeout or the model's error."""
        if self._workers.available == 0 and self.waiting >= self._max_queue_depth:
            self._metrics.queue_rejected.inc()
            raise QueueFull(f"server busy: {self.waiting} requests already queued")
        return Deferred.fromCoroutine(self._infer(request))

    async def _infer(self, request: InferenceRequest) -> EncodedResult:
        ctx = RunContext()
        started = self._clock.seconds()
        deadline = None if self._timeout_s is None else started + self._timeout_s
        try:
            if self._batcher is not None:
                work = self._batcher.submit(request, ctx)
                result = await within(
                    self._clock, work, self._timeout_s, cancel_on_expiry=True,
                    on_expiry=ctx.cancel,
                )  # fmt: skip
            else:
                lease: WorkerLease[Model] = await within(
                    self._clock, self._workers.acquire("sync"), self._timeout_s,
                    cancel_on_expiry=True,
                )  # fmt: skip
                self._metrics.queue_wait_by_path["sync"].observe(
                    (self._clock.seconds() - started) * 1000.0
                )
                run = run_model(self._threads, lease.worker, request, ctx)
                run.addBoth(_release_after, lease)
                remaining = None if deadline is None else deadline - self._clock.seconds()
                result = await within(
                    self._clock, run, remaining, cancel_on_expiry=False, on_expiry=ctx.cancel
                )
        except DeadlineExpired:
            raise RunTimeout(
                f"model run exceeded model_run_timeout ({int((self._timeout_s or 0) * 1000)} ms)"
            ) from None
        except CancelledError:
            ctx.cancel()
            raise
        self._metrics.inference_by_path["sync"].observe(result.run_ms)
        return result


def _release_after(result: Any, lease: WorkerLease[Model]) -> Any:
    lease.release()
    return result
