"""``JobStore``: everything the HTTP edge and the job runner do with jobs (pure).

Two implementations: :class:`~mortred_twisted.stores.memory_store.MemoryJobStore`
(the in-process :class:`~mortred_twisted.jobs.ledger.AsyncJobTable`, the embedded
default) and :class:`~mortred_twisted.stores.redis_store.RedisJobStore` (a Redis
shared by every replica of one model id).

**Answers are "maybe deferred".** Each call returns either its value or a
``Deferred`` of it (:data:`Maybe`). The memory store answers with plain values, so
the hot poll/submit path pays nothing for the abstraction; the Redis store answers
with Deferreds (no Redis call ever blocks the reactor thread). Callers go through
:func:`then` (or ``await`` via :func:`settle`), which handles both.

**Contract shared by both stores** (tests/jobs/test_store_contract.py runs it on both):

- ``submit`` is one atomic admission step: the queue-full check and the depth
  increment cannot interleave with another admission, in this process or another.
- ``terminate(job_id, state, …)`` is the single non-terminal → terminal transition
  (any state of ``TERMINAL_STATES``): it happens at most once per job, frees the
  request payload, decrements the depth once and makes the job visible to
  retention. It answers the state the job ended in (a job whose cancel was
  accepted ends ``cancelled`` when asked to end ``done``); later calls answer None.
  New terminal states (e.g. ``cancelled``) need no new method.
- Whoever ends a job counts it and sends its ``completed`` webhook, once: the
  runner for its ``terminate`` calls, the cancel route for a pending job it
  cancelled, and the runtime (through a shared store's ``on_ended``) for jobs a
  shared store ends by itself (upkeep, claim).
- Retention (TTL after completion, then LRU beyond ``max_completed``) only ever
  removes terminal jobs.
- ``snapshot``/``take_result`` answer ``None``/``found=False`` for unknown ids and
  refresh the job's LRU position.

**Two ways a job reaches a worker** (``pull``): the memory store is push — the
route that admitted a job hands it to the runner, which calls :meth:`JobStore.begin`
once a worker is free. A shared store is pull — a replica with a free worker calls
:meth:`JobStore.claim_next`, which takes the next pending job of the model id in the
fair order (``jobs/fair_queue.py``: callers' weights, priority bands) for
this replica (under a lease the replica renews) or answers None.

This module imports no Twisted at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol, TypeVar

from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.types import Admission, JobPage, JobSnapshot, ResultLookup

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
U = TypeVar("U")
RequestT = TypeVar("RequestT")


class Pending(Protocol[T_co]):
    """What this module needs of an answer still to come (a Twisted ``Deferred`` is
    one): chaining and awaiting. Spelled here so the core imports no Twisted."""

    def addCallback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def __await__(self) -> Generator[Any, None, T_co]: ...


#: A value, or a Deferred that fires with it.
Maybe = T | Pending[T]


class WakeCounters(Protocol):
    """What a shared store needs of the process's named counters (the runtime's
    :class:`~mortred_twisted.runtime.counters.NamedCounters`): wake the waiters of a
    job whose event arrived from another process, and list who waits."""

    def count_by_name(self, name: str, n: int | None = 1) -> int: ...

    def names(self) -> list[str]: ...


class StoreUnavailable(Exception):
    """The job store cannot be reached (Redis down): the HTTP edge answers 503."""


class Claim(NamedTuple):
    """A job taken by :meth:`JobStore.claim_next` for this replica to run."""

    job_id: str
    request: Any
    #: time since admission (store clock), for the ``async_timeout`` budget
    age_ms: int
    #: 1 on the first run, +1 on each run after a lost replica
    attempt: int


def then(value: Maybe[T], fn: Callable[[T], U]) -> Maybe[U]:
    """``fn(value)`` now for a plain value, or chained for a Deferred."""
    add = getattr(value, "addCallback", None)
    if add is None:
        return fn(value)  # type: ignore[arg-type]
    return add(fn)


async def settle(value: Maybe[T]) -> T:
    """Await a :data:`Maybe` inside a coroutine."""
    if hasattr(value, "addCallback"):
        return await value  # type: ignore[misc]
    return value  # type: ignore[return-value]


class JobStore(Protocol[RequestT]):
    """The operations of the job path. See the module docstring for the contract.

    Thread contract: the reactor thread, except :meth:`set_progress` (any thread).
    """

    #: True when jobs are pulled by replicas (:meth:`claim_next`) rather than pushed.
    pull: bool
    #: Whether terminal events of jobs run elsewhere arrive by subscription.
    shared: bool

    @property
    def max_queue(self) -> int: ...

    @property
    def queue_depth(self) -> int:
        """Admitted, non-terminal jobs (the last value seen, for the gauge)."""
        ...

    def submit(self, request: RequestT, task_id: str = "") -> Maybe[str | None]:
        """Admit a pending job; its id, or None when ``max_queue`` jobs are admitted."""
        ...

    def admit(
        self,
        request: RequestT,
        task_id: str = "",
        *,
        owner: str = "",
        idempotency_key: str | None = None,
        fingerprint: str = "",
        webhook: tuple[str, frozenset[str]] | None = None,
    ) -> Maybe[Admission]:
        """Admit a job for ``owner`` (the caller's principal), at most once per
        ``(owner, idempotency_key)`` while that key's job is retained: the key's job
        again (``replayed``) for the same ``fingerprint``, ``conflict`` for another.
        One atomic step with the queue-full check."""
        ...

    def cancel(self, job_id: str) -> Maybe[tuple[CancelOutcome, JobSnapshot | None]]:
        """Pending → ``cancelled`` at once; running → flagged (the runner that runs
        it stops it); terminal → unchanged. What happened, and the snapshot after.

        An accepted cancel (``cancelled`` or ``requested``) is never lost and never
        ends ``done``: a shared store keeps the flag with the job and its replicas
        read it (at claim, lease renewal, progress writes, reconnection); a run that
        returns a result after the flag ends ``cancelled``."""
        ...

    def webhook_of(self, job_id: str) -> Maybe[tuple[str, frozenset[str]] | None]:
        """The webhook (URL, events filter) the job was submitted with, if any."""
        ...

    def cancel_requested(self, job_id: str) -> Maybe[bool]:
        """Whether a running job has been asked to stop."""
        ...

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: frozenset[JobState] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Maybe[JobPage]:
        """Retained jobs newest first, only ``owner``'s (all when None); ValueError
        for a malformed cursor."""
        ...

    def begin(self, job_id: str) -> Maybe[RequestT | None]:
        """Push mode: ``pending → running`` and hand out the request payload, or None
        when the job is no longer pending (already ended)."""
        ...

    def claim_next(self) -> Maybe[Claim | None]:
        """Pull mode: the next pending job in the fair order, now running on this
        replica, or None."""
        ...

    def terminate(
        self, job_id: str, state: JobState, *, result: Any = None, error: str | None = None
    ) -> Maybe[JobState | None]:
        """The one terminal transition (``state`` terminal): the state the job ended
        in (``cancelled`` for a ``done`` whose cancel was accepted), None if refused."""
        ...

    def set_progress(self, job_id: str, step: int, total: int) -> None:
        """Record a running job's progress (fire and forget; any thread)."""
        ...

    def snapshot(self, job_id: str) -> Maybe[JobSnapshot | None]: ...

    def take_result(self, job_id: str) -> Maybe[ResultLookup]: ...

    def maintain(self) -> Maybe[int]:
        """Periodic upkeep: retention (and for a shared store lease renewal, reclaim
        of jobs whose replica died, time-out of overdue pending jobs). Returns the
        number of jobs it removed or ended."""
        ...

    def orphaned_at_shutdown(self) -> Maybe[list[str]]:
        """Ids of non-terminal jobs that die with this process (the memory store's
        jobs; none for a shared store, whose jobs outlive a replica)."""
        ...

    def hand_back(self, job_id: str) -> Maybe[bool]:
        """Give a job this replica runs back to the queue (graceful stop of a
        replica). False when the store cannot (memory) or the job is not ours. The
        replica stops holding the job even when the store cannot be reached (its
        lease then expires and another replica re-runs it)."""
        ...
