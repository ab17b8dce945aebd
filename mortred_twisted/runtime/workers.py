"""The worker pool: ``worker_nums`` model instances shared by ``/infer`` and ``/jobs``.

Workflow's ``BlockingConcurrentQueue<WORKER>`` in reactor terms. Sharing one pool
between the sync and the async path is the resource-arbitration design of the seed:
a long diffusion job and a burst of ``/infer`` calls compete for the same instances,
first come, first served.

A worker that declares ``run_capacity = n`` (a step-batching model, see
``model_api/base.py``) is n slots: it may be leased n times at once, and ``size``,
``available`` and ``busy`` count slots. Slots of several such workers are handed
out in turn.

Thread contract: reactor thread only. Ownership: :meth:`WorkerPool.acquire` returns
a Deferred firing with a :class:`WorkerLease`; the holder must call
:meth:`WorkerLease.release` exactly once (extra calls are ignored) — after the
model's thread has *returned*, never merely after a timeout, so the pool never
oversubscribes the model. Cancelling a pending ``acquire`` Deferred removes the
waiter from the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from twisted.internet.defer import Deferred, succeed

W = TypeVar("W")


class WorkerLease(Generic[W]):
    """Exclusive use of one worker until :meth:`release`."""

    __slots__ = ("_pool", "_released", "worker")

    def __init__(self, pool: WorkerPool[W], worker: W) -> None:
        self._pool = pool
        self.worker = worker
        self._released = False

    def release(self) -> None:
        """Give the worker back (idempotent)."""
        if not self._released:
            self._released = True
            self._pool._give_back(self.worker)


class _Waiter(Generic[W]):
    __slots__ = ("deferred", "kind")

    def __init__(self, kind: str, deferred: Deferred[WorkerLease[W]]) -> None:
        self.kind = kind
        self.deferred = deferred


class WorkerPool(Generic[W]):
    """FIFO hand-out of a fixed set of workers."""

    def __init__(self, workers: Sequence[W]) -> None:
        if not workers:
            raise ValueError("a worker pool needs at least one worker")
        capacity = [max(1, int(getattr(w, "run_capacity", 1))) for w in workers]
        slots = list(zip(workers, capacity, strict=True))
        self._all = [w for n in range(max(capacity)) for w, c in slots if n < c]
        self._free: deque[W] = deque(self._all)
        self._waiters: deque[_Waiter[W]] = deque()
        self._waiting_by_kind: dict[str, int] = {}
        #: Called when a worker becomes free with nobody waiting (pull-mode runners
        #: take their next job then).
        self.on_free: Callable[[], None] | None = None

    @property
    def size(self) -> int:
        return len(self._all)

    @property
    def available(self) -> int:
        return len(self._free)

    @property
    def busy(self) -> int:
        return len(self._all) - len(self._free)

    @property
    def workers(self) -> list[W]:
        """Every slot's worker (a worker of capacity n appears n times)."""
        return list(self._all)

    def waiting(self, kind: str | None = None) -> int:
        """Queued acquirers, all or of one ``kind`` (e.g. ``"sync"``)."""
        if kind is None:
            return len(self._waiters)
        return self._waiting_by_kind.get(kind, 0)

    def acquire(self, kind: str = "sync") -> Deferred[WorkerLease[W]]:
        """A lease on the next free worker; FIFO among waiters of every kind."""
        if self._free and not self._waiters:
            return succeed(WorkerLease(self, self._free.popleft()))
        waiter: _Waiter[W]

        def cancel(_d: Deferred[Any]) -> None:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                return
            self._waiting_by_kind[kind] -= 1

        waiter = _Waiter(kind, Deferred(cancel))
        self._waiters.append(waiter)
        self._waiting_by_kind[kind] = self._waiting_by_kind.get(kind, 0) + 1
        return waiter.deferred

    def _give_back(self, worker: W) -> None:
        if self._waiters:
            waiter = self._waiters.popleft()
            self._waiting_by_kind[waiter.kind] -= 1
            waiter.deferred.callback(WorkerLease(self, worker))
        else:
            self._free.append(worker)
            if self.on_free is not None:
                self.on_free()
