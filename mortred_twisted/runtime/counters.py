"""``NamedCounters``: Workflow's named counter, on the reactor thread.

``counter(name, target)`` returns a Deferred that fires (with ``name``) once the
counter has been counted ``target`` times; ``count_by_name(name, n)`` counts the
counters registered under ``name``. This mirrors Workflow's
``create_counter_task(name, target)`` / ``count_by_name(name, n)``: with an int ``n``
the ``n`` counts go to the counters in creation order (a counter that reaches its
target leaves the registry and the next count goes to the next one). With
``n=None`` every counter of that name is counted once: the job runner uses that to
wake every waiter of a job (each waiter is a counter with target 1).

Thread contract: reactor thread only. Ownership: a waiter owns its Deferred;
cancelling it removes the counter (no leak: an empty name leaves the registry).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet.defer import Deferred


class _Counter:
    """One waiter: its Deferred, the counts it still needs, and where it is filed."""

    __slots__ = ("_name", "_registry", "deferred", "remaining")

    def __init__(self, registry: NamedCounters, name: str, target: int) -> None:
        self.remaining = target
        self._registry: NamedCounters | None = registry
        self._name = name
        self.deferred: Deferred[str] = Deferred(self._cancel)

    def _cancel(self, _d: Deferred[Any]) -> None:
        if self._registry is not None:
            self._registry._remove(self._name, self)


class NamedCounters:
    """A registry of named counters. See the module docstring for the contract."""

    def __init__(self) -> None:
        self._by_name: dict[str, deque[_Counter]] = {}

    def counter(self, name: str, target: int = 1) -> Deferred[str]:
        """A Deferred firing with ``name`` after ``target`` counts (``target >= 1``)."""
        if target < 1:
            raise ValueError("target must be >= 1")
        entry = _Counter(self, name, target)
        self._by_name.setdefault(name, deque()).append(entry)
        return entry.deferred

    def count_by_name(self, name: str, n: int | None = 1) -> int:
        """Count the counters of ``name``; return how many reached their target.

        ``n`` counts go to counters in creation order; ``n=None`` counts every
        counter of ``name`` once.
        """
        queue = self._by_name.get(name)
        if not queue:
            return 0
        fired: list[_Counter] = []
        if n is None:
            for entry in list(queue):
                entry.remaining -= 1
                if entry.remaining <= 0:
                    fired.append(entry)
        else:
            budget = n
            for entry in list(queue):
                if budget <= 0:
                    break
                used = min(budget, entry.remaining)
                entry.remaining -= used
                budget -= used
                if entry.remaining <= 0:
                    fired.append(entry)
        for entry in fired:
            queue.remove(entry)
            entry._registry = None
        if not queue:
            del self._by_name[name]
        # Fire after the registry is consistent: a callback may register again.
        for entry in fired:
            entry.deferred.callback(name)
        return len(fired)

    def waiting(self, name: str) -> int:
        """How many counters are registered under ``name``."""
        return len(self._by_name.get(name, ()))

    def names(self) -> list[str]:
        """The names with at least one counter (e.g. to re-check them after a gap)."""
        return list(self._by_name)

    @property
    def total_waiting(self) -> int:
        """Counters registered under any name (parked long-polls, for the metrics)."""
        return sum(len(q) for q in self._by_name.values())

    def __len__(self) -> int:
        """Number of names with at least one counter (for leak checks)."""
        return len(self._by_name)

    def _remove(self, name: str, entry: _Counter) -> None:
        queue = self._by_name.get(name)
        if queue is None:
            return
        try:
            queue.remove(entry)
        except ValueError:
            return
        entry._registry = None
        if not queue:
            del self._by_name[name]
