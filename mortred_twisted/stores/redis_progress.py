"""``ProgressWriter``: coalesced progress writes of the jobs one replica runs (the
Redis store's :meth:`~mortred_twisted.stores.redis_store.RedisJobStore.set_progress`).

A model reports every step from its worker thread; each report would otherwise cost
a reactor hop, an ``EVALSHA`` and a ``PUBLISH`` fanned out to every replica. Here
the latest step per job is kept under a lock, and at most one write per job goes
out every ``interval_s`` (0.2 s: ≤ 5 a second), plus the last step (``step ==
total``) at once: one reactor hop per write, not per step.

Thread contract: :meth:`report` from any thread; everything else on the reactor
thread. ``write(job_id, "step/total")`` is called on the reactor thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

PROGRESS_INTERVAL_S = 0.2


class ProgressWriter:
    """See the module docstring."""

    def __init__(
        self,
        reactor: Any,
        write: Callable[[str, str], None],
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._reactor = reactor
        self._write = write
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[int, int]] = {}  # guarded by _lock
        self._written_at: dict[str, float] = {}
        self._timers: dict[str, Any] = {}

    def report(self, job_id: str, step: int, total: int) -> None:
        """Any thread: the run of ``job_id`` reached ``step`` of ``total``."""
        with self._lock:
            first = job_id not in self._latest
            self._latest[job_id] = (step, total)
        if first or step >= total:
            self._reactor.callFromThread(self._due, job_id)

    def forget(self, job_id: str) -> None:
        """The job ended or left this replica: drop what was not written."""
        timer = self._timers.pop(job_id, None)
        if timer is not None and timer.active():
            timer.cancel()
        with self._lock:
            self._latest.pop(job_id, None)
        self._written_at.pop(job_id, None)

    def stop(self) -> None:
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()

    def _last_step_waits(self, job_id: str) -> bool:
        with self._lock:
            latest = self._latest.get(job_id)
        return latest is not None and latest[0] >= latest[1]

    def _due(self, job_id: str) -> None:
        final = self._last_step_waits(job_id)
        timer = self._timers.get(job_id)
        if timer is not None:
            if not final:
                return  # the scheduled write takes the latest step
            del self._timers[job_id]
            if timer.active():
                timer.cancel()
        wait = self._written_at.get(job_id, float("-inf")) + self._interval_s
        wait -= self._reactor.seconds()
        if not final and wait > 0:
            self._timers[job_id] = self._reactor.callLater(wait, self._flush, job_id)
            return
        self._flush(job_id)

    def _flush(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        with self._lock:
            latest = self._latest.pop(job_id, None)
        if latest is None:
            return
        self._written_at[job_id] = self._reactor.seconds()
        self._write(job_id, f"{latest[0]}/{latest[1]}")
