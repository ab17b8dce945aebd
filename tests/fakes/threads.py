"""A hand-stepped stand-in for the model thread pool (same ``run`` signature).

``run`` queues the call; the test runs queued calls on its own thread with
:meth:`HandThreads.step`, so orderings ("the job had not started when the 202
was sent") are observable without real threads or sleeps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mortred_twisted.runtime.execution import ThreadRunner


class HandThreads:
    def __init__(self) -> None:
        self.queue: deque[tuple[Callable[..., Any], tuple, dict, Deferred]] = deque()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.queue.append((fn, args, kwargs, d))
        return d

    @property
    def pending(self) -> int:
        return len(self.queue)

    def step(self) -> Any:
        """Run the oldest queued call now and fire its Deferred with the outcome."""
        fn, args, kwargs, d = self.queue.popleft()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            d.errback(Failure())
            return None
        d.callback(result)
        return result

    def drain(self) -> None:
        while self.queue:
            self.step()


_check: ThreadRunner = HandThreads()  # structural check against the real interface
