"""``MemoryJobStore``: the :class:`~mortred_twisted.jobs.store.JobStore` of one
process, a thin adapter over :class:`~mortred_twisted.jobs.ledger.AsyncJobTable`.

Every answer is a plain value (no Deferred): the embedded default keeps the
measured poll/submit cost of the bare ledger. Jobs live and die with the process
(a restarted server answers 404 for its old ids).

Pure: no Twisted. Thread contract: that of the ledger (any thread).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any, Generic, TypeVar

from mortred_twisted.jobs.fair_queue import DEFAULT_PRIORITY, DEFAULT_TERMS, CallerTerms
from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.store import Claim
from mortred_twisted.jobs.types import (
    Admission,
    JobPage,
    JobSnapshot,
    QueueView,
    ResultLookup,
)

RequestT = TypeVar("RequestT")


class MemoryJobStore(Generic[RequestT]):
    """Push-mode store over one ledger (``store.ledger`` for tests and tools)."""

    pull = False
    shared = False
    #: Admission takes ``terms``/``priority`` and pending jobs start in fair order.
    fair = True

    def __init__(self, ledger: AsyncJobTable[RequestT]) -> None:
        self.ledger = ledger

    @property
    def max_queue(self) -> int:
        return self.ledger.max_queue

    @property
    def queue_depth(self) -> int:
        return self.ledger.queue_depth

    def submit(self, request: RequestT, task_id: str = "") -> str | None:
        return self.ledger.submit(request, task_id)

    def begin(self, job_id: str) -> RequestT | None:
        if not self.ledger.transition_running(job_id):
            return None
        request = self.ledger.take_request(job_id)
        if request is None:  # only begin() takes it, so this is a bug somewhere
            self.ledger.fail(job_id, "job payload missing")
        return request

    def claim_next(self) -> Claim | None:
        return None  # push mode: the runner is handed every job it runs

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
        return self.ledger.admit(
            request, task_id, owner=owner, idempotency_key=idempotency_key,
            fingerprint=fingerprint, webhook=webhook, terms=terms, priority=priority,
        )  # fmt: skip

    def next_pending(
        self, eligible: Container[str] | Callable[[str], bool] | None = None
    ) -> str | None:
        """Push mode: which of the runner's ready jobs takes a free worker (fair order)."""
        return self.ledger.next_pending(eligible)

    def queue_view(self, owner: str | None = None) -> QueueView:
        return self.ledger.queue_view(owner)

    def caller_limit(self, terms: CallerTerms = DEFAULT_TERMS) -> int:
        return self.ledger.caller_limit(terms)

    def active_of(self, owner: str) -> tuple[int, int, int]:
        return self.ledger.active_of(owner)

    def webhook_of(self, job_id: str) -> tuple[str, frozenset[str]] | None:
        return self.ledger.webhook_of(job_id)

    def terminate(
        self, job_id: str, state: JobState, *, result: Any = None, error: str | None = None
    ) -> JobState | None:
        """The terminal transition: the state the job ended in, or None. A job whose
        cancel was accepted never ends ``done`` (as on Redis): it ends ``cancelled``."""
        if state is JobState.DONE and self.ledger.cancel_requested(job_id):
            state, result = JobState.CANCELLED, None
            error = "cancelled by request (the run finished first)"
        if not self.ledger.terminate(job_id, state, result=result, error=error):
            return None
        return state

    def cancel(self, job_id: str) -> tuple[CancelOutcome, JobSnapshot | None]:
        return self.ledger.cancel(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        return self.ledger.cancel_requested(job_id)

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: frozenset[JobState] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        return self.ledger.list_jobs(owner=owner, states=states, limit=limit, cursor=cursor)

    def set_progress(self, job_id: str, step: int, total: int) -> None:
        self.ledger.set_progress(job_id, step, total)

    def snapshot(self, job_id: str) -> JobSnapshot | None:
        return self.ledger.snapshot(job_id)

    def take_result(self, job_id: str) -> ResultLookup:
        return self.ledger.take_result(job_id)

    def maintain(self) -> int:
        return self.ledger.evict_expired()

    def orphaned_at_shutdown(self) -> list[str]:
        return self.ledger.nonterminal_ids()

    def hand_back(self, job_id: str) -> bool:
        return False
