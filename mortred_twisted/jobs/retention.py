"""``RetainedJobs``: which finished job retention removes next (pure).

Finished (terminal) jobs are kept until ``job_ttl_ms`` after completion, and at most
``max_completed`` of them. Beyond that limit the least recently *used* job (a poll or
a result fetch is a use) of the caller holding the **most** finished jobs goes
first. Every caller holding finished jobs has an equal share (``max_completed / n``
for ``n`` such callers); whenever more than ``max_completed`` are held someone is
above its share, and the caller with the most is. So one caller's finished jobs
never evict another caller's results while that caller is within its share; with a
single caller this is plain LRU. Ties go to the caller whose least recently used job
is the oldest.

Thread contract: none (the ledger's lock guards it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator


class RetainedJobs:
    """Finished jobs by completion time (TTL) and by last use per caller (LRU)."""

    def __init__(self) -> None:
        self._by_completion: OrderedDict[str, float] = OrderedDict()
        self._owner: dict[str, str] = {}
        self._by_use: dict[str, OrderedDict[str, int]] = {}
        self._tick = 0

    def __len__(self) -> int:
        return len(self._owner)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._owner

    def add(self, job_id: str, owner: str, completed_at: float) -> None:
        """A job just finished: it is the newest and the most recently used."""
        self._by_completion[job_id] = completed_at
        self._owner[job_id] = owner
        self._tick += 1
        self._by_use.setdefault(owner, OrderedDict())[job_id] = self._tick

    def touch(self, job_id: str) -> None:
        """A use of ``job_id`` (no-op unless retained)."""
        owner = self._owner.get(job_id)
        if owner is not None:
            self._tick += 1
            uses = self._by_use[owner]
            uses[job_id] = self._tick
            uses.move_to_end(job_id)

    def remove(self, job_id: str) -> None:
        owner = self._owner.pop(job_id, None)
        if owner is None:
            return
        self._by_completion.pop(job_id, None)
        uses = self._by_use[owner]
        uses.pop(job_id, None)
        if not uses:
            del self._by_use[owner]

    def held_by(self, owner: str) -> int:
        uses = self._by_use.get(owner)
        return 0 if uses is None else len(uses)

    def expired(self, horizon: float) -> Iterator[str]:
        """Ids completed at or before ``horizon``, oldest first (stops at the first
        younger one). The caller removes each before asking for the next."""
        while self._by_completion:
            job_id, completed_at = next(iter(self._by_completion.items()))
            if completed_at > horizon:
                return
            yield job_id

    def victim(self, limit: int) -> str | None:
        """The job to remove while more than ``limit`` are held (module docstring),
        else None."""
        if len(self._owner) <= max(limit, 0):
            return None
        by_use = self._by_use
        if len(by_use) == 1:
            return next(iter(next(iter(by_use.values()))))
        most = max(map(len, by_use.values()))
        best_tick = -1
        chosen = ""
        for uses in by_use.values():
            if len(uses) == most:
                job_id, tick = next(iter(uses.items()))
                if best_tick < 0 or tick < best_tick:
                    best_tick, chosen = tick, job_id
        return chosen
