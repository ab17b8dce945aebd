"""Model threads yield the CPU to the reactor: lower scheduling priority per thread."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from mortred_twisted.runtime.threads import lower_thread_priority

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")


@linux_only
def test_lowering_priority_affects_only_the_calling_thread() -> None:
    """A thread that lowers its priority gets nicer; the main thread keeps its own."""
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if main_before >= 19:
        pytest.skip("already at the lowest priority (the run itself is niced)")
    seen: list[tuple[bool, int]] = []

    def worker() -> None:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        ok = lower_thread_priority(5)
        seen.append((ok, os.getpriority(os.PRIO_PROCESS, tid) - before))

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    ok, delta = seen[0]
    assert ok and delta > 0
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_zero_niceness_is_a_noop() -> None:
    """niceness 0 changes nothing."""
    assert lower_thread_priority(0) is False
