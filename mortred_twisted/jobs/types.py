"""The job API's value types, shared by every job store and the edge (pure): a job's
view (:class:`JobSnapshot`), the answers of admission, result lookup and listing, and
a model's queue view. Immutable; built by the stores, rendered by ``jobs/status.py``
and the HTTP routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from mortred_twisted.jobs.states import TERMINAL_STATES, JobState


class JobSnapshot(NamedTuple):
    """A consistent view of one job, taken under the lock.

    A named tuple rather than a frozen dataclass: every poll builds one, and tuple
    construction is several times cheaper.
    """

    job_id: str
    state: JobState
    task_id: str
    elapsed_ms: int
    error: str | None
    progress: tuple[int, int] | None
    queued_ms: int | None  # time from admission to running (None while pending)
    completed_unix: float | None = None  # wall-clock time of the terminal transition
    queue_position: int | None = None  # pending only: 1 = the next to get a worker
    cancel_requested: bool = False  # running, and asked to stop
    owner: str = ""  # the caller (principal) that submitted it; "" = the port itself

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class ResultLookup:
    """The answer of :meth:`AsyncJobTable.take_result`.

    ``found`` False → 404; ``state`` not DONE → 409; else ``result`` is the stored
    result (repeatable until retention evicts the job) and ``task_id`` the request id.
    """

    found: bool
    state: JobState | None = None
    result: Any = None
    task_id: str = ""
    owner: str = ""  # the caller that submitted it (per-caller isolation)

    @property
    def done(self) -> bool:
        return self.state is JobState.DONE


class Admission(NamedTuple):
    """The answer of an admission (:meth:`AsyncJobTable.admit`).

    ``job_id`` None with ``conflict`` False means the queue is full (429):
    ``over_quota`` True when it is the caller's own limit (``limit`` jobs pending
    or running), not the model's queue. With an idempotency key: ``replayed`` True
    means the key's job already exists and ``job_id`` is that job (nothing
    admitted); ``conflict`` True means the key is taken by a request with another
    body (422).
    """

    job_id: str | None
    replayed: bool = False
    conflict: bool = False
    over_quota: bool = False
    limit: int = 0


class CallerLine(NamedTuple):
    """One caller's share of a model's queue (``GET /queue``)."""

    caller: str
    pending: int
    running: int
    oldest_wait_ms: int  # age of its oldest pending job; 0 when none
    limit: int  # its max_pending as last admitted (0 = only the model's queue)


class QueueView(NamedTuple):
    """A model's queue: totals and one line per caller with pending/running jobs."""

    depth: int
    pending: int
    running: int
    oldest_wait_ms: int
    max_queue: int
    callers: list[CallerLine]


class JobPage(NamedTuple):
    """One page of a listing, newest first; ``next_cursor`` None on the last page."""

    jobs: list[JobSnapshot]
    next_cursor: str | None
