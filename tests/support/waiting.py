"""Waiting in end-to-end tests: on an event where one exists, else by bounded polling.

Real processes (a supervisor's status, a gateway's metrics, a browser's page) change
state on their own time and tell the test process nothing: there is no event to
wait on, so :func:`wait_until` polls the condition, sleeping a short, stated
interval between checks, and fails with a message after a deadline. The deadline
is a bound on a hang, not a timing assertion: pick it generously. Where the test
process itself owns a signal (a thread of its own, a line read from a child's
output), wait on that instead (``threading.Event.wait``, ``Thread.join``), as
``tests/support/servers.py`` does for a server's "ready" line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two checks of a polled condition: short next to any state
#: change a test waits for, long enough not to steal the CPU those changes need.
POLL_INTERVAL_S = 0.05


def wait_until(
    condition: Callable[[], T], timeout: float, what: str, interval: float = POLL_INTERVAL_S
) -> T:
    """Check ``condition`` until it returns something truthy, and return that.

    Sleeps ``interval`` seconds between checks (``0`` when ``condition`` paces
    itself, e.g. with a long-poll request). Raises AssertionError naming ``what``
    once ``timeout`` seconds have passed without success; the condition is always
    checked at least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if interval > 0:
            time.sleep(min(interval, remaining))  # polling: nothing will notify us
