"""``AsyncJobTable``: the async-job ledger (pure, thread-safe; no Twisted, no HTTP).

The ledger owns identity (``job_…`` ids), admission, the state machine, retention
(TTL then LRU) and wait/notify. It knows nothing of HTTP, the worker pool or metrics:
every transition returns a bool and the caller does the side effects (metrics,
waking reactor waiters). This is a port of the C++ ``async_job_table.h`` rework.

Concurrency contract (the five invariants; any change must preserve all five):

1. **State is readable without the lock.** ``_Job.state`` is a single attribute
   holding an immutable enum; a read is atomic in CPython (and under free threading
   a plain attribute load of an object reference is too). :meth:`state` and the
   terminal checks of eviction and wait predicates read it without locking.
2. **One lock guards payload and condition.** ``self._lock`` guards result, error,
   timestamps and the maps, and is the lock of ``self._changed`` (the condition
   variable). Every transition writes the payload, publishes the state and calls
   ``notify_all`` inside one critical section, so a waiter can never evaluate its
   predicate between the state store and the notify: no lost wakeup.
3. **Admission is one atomic step.** The queue-full check and the increment of
   ``queue_depth`` happen under the same lock acquisition in :meth:`submit`.
4. **Depth is decremented exactly once per admitted job**, on the single
   non-terminal → terminal transition; terminal states absorb, so a second
   ``finish``/``fail``/``timeout`` returns False and changes nothing.
5. **Fixed lock order.** There is one lock; retention (``_evict_locked``) runs with
   it held and takes no other lock, so no deadlock is possible.

Cancel (:meth:`cancel`) is a transition like the others: a pending job ends
``cancelled`` in one critical section (depth decremented once, invariant 4); a
running one is only flagged, and its runner performs the terminal transition when
the run stops. Idempotency keys live under the same lock as admission, so the key
lookup, the admission check and the key's registration are one step (two
concurrent submits with one key admit one job); a key is forgotten with its job.

Retention runs on :meth:`submit` (as the C++ ledger did) and on
:meth:`evict_expired`, which the server calls periodically so an idle server frees
expired jobs too: first TTL (``job_ttl_ms`` after ``completed_at``), then beyond
``max_completed`` terminal jobs the least recently *used* (a poll or a result fetch
refreshes a job) of the caller holding the most (``jobs/retention.py``: a caller
within its share never loses a result to another). Non-terminal jobs are never
evicted: they are not in the retention structure until they terminate.

**Fair share** (``jobs/fair_queue.py``): pending jobs are kept in weighted-fair
order across callers with priority bands; :meth:`next_pending` names the job a
free worker takes, :meth:`transition_running` records the start, and admission
checks the caller's own limit (``max_pending``, else ``max_pending_per_caller``)
in the same critical section as the model's ``max_queue``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Container
from typing import Any, Generic, TypeVar

from mortred_twisted.ids import new_job_id
from mortred_twisted.jobs.fair_queue import (
    DEFAULT_PRIORITY,
    DEFAULT_TERMS,
    CallerTerms,
    FairQueue,
)
from mortred_twisted.jobs.retention import RetainedJobs
from mortred_twisted.jobs.states import (
    CancelOutcome,
    JobState,
    can_transition,
)
from mortred_twisted.jobs.types import (
    Admission,
    CallerLine,
    JobPage,
    JobSnapshot,
    QueueView,
    ResultLookup,
)

RequestT = TypeVar("RequestT")

Clock = Callable[[], float]


def parse_cursor(cursor: str | None) -> int | None:
    """A listing cursor (``c<sequence>``) as the sequence it stops before; ValueError."""
    if cursor is None or cursor == "":
        return None
    if not cursor.startswith("c") or not cursor[1:].isdigit() or len(cursor) > 20:
        raise ValueError(f"invalid cursor: {cursor[:40]!r}")
    return int(cursor[1:])


class _Job:
    __slots__ = (
        "cancel_requested",
        "completed_at",
        "completed_unix",
        "created_at",
        "error",
        "idempotency",
        "job_id",
        "owner",
        "progress",
        "request",
        "result",
        "seq",
        "started_at",
        "state",
        "task_id",
        "webhook",
    )

    def __init__(
        self, job_id: str, task_id: str, request: Any, now: float, seq: int, owner: str
    ) -> None:
        self.webhook: tuple[str, frozenset[str]] | None = None
        self.job_id = job_id
        self.task_id = task_id
        self.request = request
        self.seq = seq
        self.owner = owner
        self.idempotency: tuple[str, str, str] | None = None  # (scope, key, fingerprint)
        self.cancel_requested = False
        self.state = JobState.PENDING
        self.result: Any = None
        self.error: str | None = None
        self.created_at = now
        self.started_at: float | None = None
        self.completed_at: float | None = None
        self.completed_unix: float | None = None
        self.progress: tuple[int, int] | None = None


class AsyncJobTable(Generic[RequestT]):
    """The ledger. All methods are safe to call from any thread.

    ``max_queue`` bounds admitted non-terminal jobs (``<= 0`` admits nothing);
    ``job_ttl_ms`` (``0`` = keep until LRU) and ``max_completed`` govern retention of
    terminal jobs. ``clock`` returns seconds (monotonic; durations, retention);
    ``wall_clock`` stamps ``completed_unix`` for clients. Tests inject both.
    """

    def __init__(
        self,
        *,
        max_queue: int,
        job_ttl_ms: int = 300_000,
        max_completed: int = 100,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        id_factory: Callable[[], str] = new_job_id,
        max_pending_per_caller: int = 0,
    ) -> None:
        self._max_queue = max_queue
        self._per_caller = max(0, max_pending_per_caller)
        self._ttl_s = job_ttl_ms / 1000.0
        self._max_completed = max_completed
        self._clock = clock
        self._wall_clock = wall_clock
        self._id_factory = id_factory
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[str, _Job] = {}
        # Terminal jobs only: by completion time (TTL) and by last use per caller.
        self._retained = RetainedJobs()
        self._depth = 0
        self._seq = 0
        # Pending jobs in fair order; pending + running per caller.
        self._fair = FairQueue()
        self._limits: dict[str, int] = {}  # caller -> limit at its last admission
        # (scope, key) -> job id, for as long as that job is retained.
        self._idempotency: dict[tuple[str, str], str] = {}

    # -- admission -------------------------------------------------------------------

    @property
    def max_queue(self) -> int:
        return self._max_queue

    @property
    def queue_depth(self) -> int:
        """Admitted jobs not yet terminal (pending + running)."""
        return self._depth

    def evict_expired(self) -> int:
        """Run retention now (TTL, then LRU); returns how many jobs it removed."""
        with self._lock:
            before = len(self._jobs)
            self._evict_locked()
            return before - len(self._jobs)

    def submit(self, request: RequestT, task_id: str = "") -> str | None:
        """Admit ``request`` as a new pending job and return its id, or None when full.

        Runs retention first. Check and increment of the depth are one atomic step.
        """
        return self.admit(request, task_id).job_id

    def admit(
        self,
        request: RequestT,
        task_id: str = "",
        *,
        owner: str = "",
        idempotency_key: str | None = None,
        fingerprint: str = "",
        webhook: tuple[str, frozenset[str]] | None = None,
        terms: CallerTerms = DEFAULT_TERMS,
        priority: str = DEFAULT_PRIORITY,
    ) -> Admission:
        """Admit a job for ``owner``, at most once per ``(owner, idempotency_key)``.
        ``webhook`` (URL, events) is kept with the job for its lifetime. ``terms``
        (weight, own limit) and ``priority`` (band) place it in the fair order; the
        caller checks ``priority`` against ``terms.max_priority`` first.

        One critical section: retention, the key lookup, the queue-full check, the
        depth increment and the key's registration, so concurrent submits with one
        key admit one job. A key is remembered while its job is retained.
        """
        with self._lock:
            self._evict_locked()
            if idempotency_key is not None:
                known = self._idempotency.get((owner, idempotency_key))
                if known is not None:
                    job = self._jobs[known]
                    assert job.idempotency is not None
                    if job.idempotency[2] != fingerprint:
                        return Admission(None, conflict=True)
                    self._touch_locked(job)
                    return Admission(known, replayed=True)
            limit = self.caller_limit(terms)
            if limit > 0 and self._fair.active(owner) >= limit:
                return Admission(None, over_quota=True, limit=limit)
            if self._depth >= self._max_queue:
                return Admission(None)
            job_id = self._id_factory()
            while job_id in self._jobs:
                job_id = self._id_factory()
            self._seq += 1
            job = _Job(job_id, task_id, request, self._clock(), self._seq, owner)
            job.webhook = webhook
            if idempotency_key is not None:
                job.idempotency = (owner, idempotency_key, fingerprint)
                self._idempotency[(owner, idempotency_key)] = job_id
            self._jobs[job_id] = job
            self._fair.push(job_id, owner, self._seq, weight=terms.weight, band=priority)
            self._limits[owner] = limit
            self._depth += 1
            return Admission(job_id)

    def caller_limit(self, terms: CallerTerms = DEFAULT_TERMS) -> int:
        """A caller's limit of pending + running jobs (0 = only ``max_queue``)."""
        if terms.max_pending is not None and terms.max_pending > 0:
            return terms.max_pending
        return self._per_caller

    def active_of(self, owner: str) -> tuple[int, int, int]:
        """``(pending, running)`` jobs of ``owner`` and the number of callers
        holding pending or running jobs."""
        with self._lock:
            fair = self._fair
            return fair.pending_of(owner), fair.running_of(owner), fair.caller_count

    def next_pending(
        self, eligible: Container[str] | Callable[[str], bool] | None = None
    ) -> str | None:
        """The pending job a free worker takes next in the fair order (among
        ``eligible`` when given), or None. Changes nothing: the start is recorded by
        :meth:`transition_running`."""
        with self._lock:
            return self._fair.next(eligible)

    def queue_view(self, owner: str | None = None) -> QueueView:
        """Totals and per-caller lines (only ``owner``'s when given)."""
        with self._lock:
            now = self._clock()
            oldest: dict[str, float] = {}
            for job in self._jobs.values():
                if job.state is JobState.PENDING and job.owner not in oldest:
                    oldest[job.owner] = job.created_at  # dict order = admission order
            lines = []
            for caller in self._fair.callers():
                if owner is not None and caller != owner:
                    continue
                since = oldest.get(caller)
                lines.append(
                    CallerLine(
                        caller, self._fair.pending_of(caller), self._fair.running_of(caller),
                        0 if since is None else int((now - since) * 1000),
                        self._limits.get(caller, self._per_caller),
                    )
                )  # fmt: skip
            if owner is not None and not lines:
                lines.append(CallerLine(owner, 0, 0, 0, self._limits.get(owner, self._per_caller)))
            first = min(oldest.values(), default=None)
            pending = self._fair.pending_count
            return QueueView(
                self._depth, pending, self._depth - pending,
                0 if first is None else int((now - first) * 1000), self._max_queue, lines,
            )  # fmt: skip

    # -- transitions ------------------------------------------------------------------

    def transition_running(self, job_id: str) -> bool:
        """``pending -> running``; False for unknown ids and any other state."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or not can_transition(job.state, JobState.RUNNING):
                return False
            job.started_at = self._clock()
            self._fair.start(job_id)
            job.state = JobState.RUNNING
            self._changed.notify_all()
            return True

    def cancel(self, job_id: str) -> tuple[CancelOutcome, JobSnapshot | None]:
        """Cancel a job: a pending one ends ``cancelled`` now (one terminal
        transition, depth decremented once); a running one is flagged
        ``cancel_requested`` (its runner stops it and ends it); a terminal one is
        left as it is. Returns what happened and the job's snapshot after it."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return CancelOutcome.UNKNOWN, None
            if job.state is JobState.PENDING:
                self._terminate_locked(job, JobState.CANCELLED, None, "cancelled by request")
                outcome = CancelOutcome.CANCELLED
            elif job.state is JobState.RUNNING:
                job.cancel_requested = True
                outcome = CancelOutcome.REQUESTED
            else:
                outcome = CancelOutcome.FINISHED
            self._touch_locked(job)
            return outcome, self._snapshot_locked(job)

    def webhook_of(self, job_id: str) -> tuple[str, frozenset[str]] | None:
        """The job's webhook (URL, events), if it was submitted with one."""
        job = self._jobs.get(job_id)
        return None if job is None else job.webhook

    def cancel_requested(self, job_id: str) -> bool:
        """Whether a running job has been asked to stop."""
        job = self._jobs.get(job_id)
        return job is not None and job.cancel_requested

    def finish(self, job_id: str, result: Any) -> bool:
        """Non-terminal -> ``done`` with ``result``. False if unknown or refused."""
        return self._terminate(job_id, JobState.DONE, result=result)

    def fail(self, job_id: str, error: str) -> bool:
        """Non-terminal -> ``failed`` with ``error``. False if unknown or terminal."""
        return self._terminate(job_id, JobState.FAILED, error=error)

    def timeout(self, job_id: str, error: str) -> bool:
        """Non-terminal -> ``timeout`` with ``error``. False if unknown or terminal."""
        return self._terminate(job_id, JobState.TIMEOUT, error=error)

    def terminate(
        self, job_id: str, target: JobState, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Non-terminal -> ``target`` (any terminal state). False if unknown or refused."""
        if not target.terminal:
            raise ValueError(f"not a terminal state: {target!r}")
        return self._terminate(job_id, target, result=result, error=error)

    def _terminate(
        self, job_id: str, target: JobState, *, result: Any = None, error: str | None = None
    ) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or not can_transition(job.state, target):
                return False
            self._terminate_locked(job, target, result, error)
            return True

    def _terminate_locked(
        self, job: _Job, target: JobState, result: Any, error: str | None
    ) -> None:
        now = self._clock()
        job.result = result
        job.error = error
        job.completed_at = now
        job.completed_unix = self._wall_clock()
        job.request = None  # never keep the payload of a finished job
        self._fair.release(job.job_id)
        job.state = target  # publish after the payload is written
        self._depth -= 1  # exactly once: terminal states absorb
        self._retained.add(job.job_id, job.owner, now)
        self._changed.notify_all()

    def set_progress(self, job_id: str, step: int, total: int) -> bool:
        """Record progress of a running job (for polls). False unless running."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                return False
            job.progress = (step, total)
            return True

    # -- reads ------------------------------------------------------------------------

    def state(self, job_id: str) -> JobState | None:
        """The job's state read without the lock (invariant 1); None if unknown."""
        job = self._jobs.get(job_id)
        return None if job is None else job.state

    def snapshot(self, job_id: str) -> JobSnapshot | None:
        """A consistent view of the job (refreshes its LRU position), or None."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            self._touch_locked(job)
            return self._snapshot_locked(job)

    def _snapshot_locked(self, job: _Job) -> JobSnapshot:
        end = job.completed_at if job.completed_at is not None else self._clock()
        queued = None
        if job.started_at is not None:
            queued = int((job.started_at - job.created_at) * 1000)
        position = None
        if job.state is JobState.PENDING:
            position = self._fair.position(job.job_id)
        return JobSnapshot(
            job_id=job.job_id,
            state=job.state,
            task_id=job.task_id,
            elapsed_ms=max(0, int((end - job.created_at) * 1000)),
            error=job.error,
            progress=job.progress,
            queued_ms=queued,
            completed_unix=job.completed_unix,
            queue_position=position,
            cancel_requested=job.cancel_requested and job.state is JobState.RUNNING,
            owner=job.owner,
        )

    def take_request(self, job_id: str) -> RequestT | None:
        """Move the request payload out, once; later calls return None.

        The ``task_id`` stays, so ``/result`` still echoes the request id.
        """
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            request, job.request = job.request, None
            return request

    def take_result(self, job_id: str) -> ResultLookup:
        """404/409/200 semantics as a :class:`ResultLookup`; repeatable."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return ResultLookup(found=False)
            self._touch_locked(job)
            if job.state is not JobState.DONE:
                return ResultLookup(
                    found=True, state=job.state, task_id=job.task_id, owner=job.owner
                )
            return ResultLookup(
                found=True, state=job.state, result=job.result, task_id=job.task_id,
                owner=job.owner,
            )  # fmt: skip

    def wait(self, job_id: str, timeout: float | None) -> JobSnapshot | None:
        """Block the calling thread until the job is terminal or ``timeout`` seconds
        pass; return its snapshot then (None if unknown).

        For unit tests and thread users; the HTTP path never blocks a thread here.
        """
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            self._changed.wait_for(lambda: job.state.terminal, timeout=timeout)
            return self._snapshot_locked(job)

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def pending_count(self) -> int:
        """Admitted jobs still waiting for a worker."""
        return self._fair.pending_count

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: frozenset[JobState] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        """Retained jobs, newest first: those of ``owner`` (every job when None),
        in ``states`` (any when None), ``limit`` per page, after ``cursor``.

        Does not refresh LRU positions (a listing is not a use of each job).
        Raises ValueError for a malformed cursor.
        """
        before = parse_cursor(cursor)
        page: list[JobSnapshot] = []
        last_seq = None
        with self._lock:
            for job_id in reversed(self._jobs):
                job = self._jobs[job_id]
                if before is not None and job.seq >= before:
                    continue
                if owner is not None and job.owner != owner:
                    continue
                if states is not None and job.state not in states:
                    continue
                if len(page) == limit:
                    return JobPage(page, f"c{last_seq}")
                page.append(self._snapshot_locked(job))
                last_seq = job.seq
        return JobPage(page, None)

    def nonterminal_ids(self) -> list[str]:
        """Ids of pending or running jobs (used to end them at shutdown)."""
        with self._lock:
            return [j.job_id for j in self._jobs.values() if not j.state.terminal]

    # -- retention --------------------------------------------------------------------

    def _touch_locked(self, job: _Job) -> None:
        self._retained.touch(job.job_id)

    def _forget_locked(self, job_id: str) -> None:
        job = self._jobs.pop(job_id)
        if job.idempotency is not None:
            self._idempotency.pop(job.idempotency[:2], None)
        self._retained.remove(job_id)

    def _evict_locked(self) -> None:
        """TTL first, then LRU beyond ``max_completed``; terminal jobs only."""
        if self._ttl_s > 0:
            for job_id in self._retained.expired(self._clock() - self._ttl_s):
                self._forget_locked(job_id)
        while (victim := self._retained.victim(self._max_completed)) is not None:
            self._forget_locked(victim)
