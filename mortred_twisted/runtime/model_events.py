"""Events a running model emits (``ctx.emit``, a streaming ``predict``'s outputs),
kept for the job's event streams and sent to its webhook.

A model thread calls :meth:`ModelEvents.emit_from_thread`; the event hops to the
reactor (``call_from_thread``), is appended to the job's buffer with the next
sequence number, wakes the job's event streams (its *events counter*) and, for
``output`` events, goes to the job's webhook when its filter names ``output``.

Retention: the last :data:`EVENTS_PER_JOB` events of each job are kept, for at most
:data:`JOBS_KEPT` jobs (least recently emitting first out), so a stream opened
during or shortly after a run sees what it emitted; a stream opened later sees the
job's status only. Events stay with the replica that ran the job (a stream reaching
another replica gets the status events only).

Thread contract: :meth:`emit_from_thread` from any thread; everything else on the
reactor thread.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

EVENTS_PER_JOB = 256
JOBS_KEPT = 1024


class ModelEvents:
    """See the module docstring."""

    def __init__(
        self,
        *,
        call_from_thread: Callable[..., Any],
        wake: Callable[[str], None],
        webhook: Callable[[str, str, Any, int], None] | None = None,
    ) -> None:
        self._call_from_thread = call_from_thread
        self._wake = wake
        self._webhook = webhook
        self._jobs: OrderedDict[str, deque[tuple[int, str, str]]] = OrderedDict()
        self._next: dict[str, int] = {}

    def emit_from_thread(self, job_id: str, name: str, data: Any) -> None:
        """A model emitted ``name`` with JSON-ready ``data`` (any thread)."""
        encoded = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        self._call_from_thread(self._record, job_id, name, encoded, data)

    def _record(self, job_id: str, name: str, encoded: str, data: Any) -> None:
        events = self._jobs.get(job_id)
        if events is None:
            events = self._jobs[job_id] = deque(maxlen=EVENTS_PER_JOB)
            while len(self._jobs) > JOBS_KEPT:
                gone, _ = self._jobs.popitem(last=False)
                self._next.pop(gone, None)
        else:
            self._jobs.move_to_end(job_id)
        seq = self._next.get(job_id, 0) + 1
        self._next[job_id] = seq
        events.append((seq, name, encoded))
        self._wake(job_id)
        if self._webhook is not None and name == "output":
            self._webhook(job_id, name, data, seq)

    def since(self, job_id: str, after: int) -> list[tuple[int, str, str]]:
        """The job's kept events numbered above ``after`` (oldest first)."""
        events = self._jobs.get(job_id)
        if not events or events[-1][0] <= after:
            return []
        return [e for e in events if e[0] > after]

    def latest(self, job_id: str) -> int:
        """The number of the job's last event (0: none)."""
        return self._next.get(job_id, 0)
