"""WorkerPool: FIFO hand-out shared by the sync and async paths; cancellable waits."""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError

from mortred_twisted.runtime.workers import WorkerPool


def test_free_workers_are_handed_out_at_once_then_callers_queue_fifo() -> None:
    """With every worker busy, acquirers of any kind are served in arrival order."""
    pool = WorkerPool(["w1"])
    first: list = []
    pool.acquire("sync").addCallback(first.append)
    order: list = []
    pool.acquire("async").addCallback(lambda lease: order.append(("async", lease)))
    pool.acquire("sync").addCallback(lambda lease: order.append(("sync", lease)))
    assert pool.busy == 1 and pool.waiting() == 2
    assert pool.waiting("sync") == 1 and pool.waiting("async") == 1
    first[0].release()
    assert [kind for kind, _ in order] == ["async"]
    order[0][1].release()
    assert [kind for kind, _ in order] == ["async", "sync"]
    order[1][1].release()
    assert pool.available == 1 and pool.waiting() == 0


def test_release_is_idempotent() -> None:
    """Releasing a lease twice gives the worker back once."""
    pool = WorkerPool(["w1", "w2"])
    leases: list = []
    pool.acquire().addCallback(leases.append)
    leases[0].release()
    leases[0].release()
    assert pool.available == 2


def test_cancelled_waiter_leaves_the_queue() -> None:
    """A cancelled acquire is removed and never receives a worker."""
    pool = WorkerPool(["w1"])
    held: list = []
    pool.acquire().addCallback(held.append)
    waiting = pool.acquire("sync")
    errors: list = []
    waiting.addErrback(lambda f: errors.append(f.check(CancelledError)))
    waiting.cancel()
    assert errors == [CancelledError] and pool.waiting("sync") == 0
    held[0].release()
    assert pool.available == 1


def test_an_empty_pool_is_refused() -> None:
    """A pool needs at least one worker."""
    with pytest.raises(ValueError):
        WorkerPool([])
