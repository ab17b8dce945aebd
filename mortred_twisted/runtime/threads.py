"""The model thread pool, owned by a service (started and stopped with the process).

Model calls run here through ``deferToThreadPool``; never on the reactor thread and
never on the reactor's global pool (which DNS and other libraries share). The pool
has exactly as many threads as there are workers: the worker pool bounds admission
in front of it, so its unbounded internal queue never grows.

GIL policy: a model thread running Python glue (a sampler loop between torch ops)
holds the GIL for up to the interpreter's switch interval each time the reactor
wants it back (5 ms by default), which is what makes an API slow while the model
is busy. The service lowers the switch interval (``switch_interval_s``) while it
runs, and runs model threads at a lower OS scheduling priority (``niceness``) so
the reactor wins the CPU whenever both want it; see docs/benchmarks.md for the
measured effect.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")

DEFAULT_SWITCH_INTERVAL_S = 0.0005


class ModelThreadPool(Service):
    """A fixed-size ``ThreadPool`` for model calls, as a Twisted service."""

    def __init__(
        self,
        reactor: IReactorFromThreads,
        size: int,
        *,
        name: str = "mortred-model",
        switch_interval_s: float | None = DEFAULT_SWITCH_INTERVAL_S,
        niceness: int = 0,
    ) -> None:
        self._reactor = reactor
        self._niceness = niceness
        self._thread_state = threading.local()
        self.pool = ThreadPool(minthreads=size, maxthreads=size, name=name)
        self._switch_interval_s = switch_interval_s
        self._saved_switch_interval: float | None = None

    def startService(self) -> None:
        super().startService()
        if self._switch_interval_s is not None:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self._switch_interval_s)
        self.pool.start()

    def stopService(self) -> Deferred[None]:
        """Join the model threads off the reactor thread (a model may still be
        finishing its current step); fires once they are gone."""
        super().stopService()
        getpool = getattr(self._reactor, "getThreadPool", None)
        if getpool is None:  # a test reactor without threads: join inline
            self._joined(None)
            self.pool.stop()
            return succeed(None)
        d = deferToThreadPool(self._reactor, getpool(), self.pool.stop)
        d.addBoth(self._joined)
        return d

    def _joined(self, result: Any) -> Any:
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
        return result

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """Run ``fn(*args, **kwargs)`` on a pool thread; the Deferred fires on the reactor."""
        if self._niceness:
            return deferToThreadPool(self._reactor, self.pool, self._niced, fn, *args, **kwargs)
        return deferToThreadPool(self._reactor, self.pool, fn, *args, **kwargs)

    def _niced(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Lower this pool thread's scheduling priority once, then run ``fn``."""
        if not getattr(self._thread_state, "niced", False):
            self._thread_state.niced = True
            lower_thread_priority(self._niceness)
        return fn(*args, **kwargs)


def lower_thread_priority(niceness: int) -> bool:
    """Make the *calling thread* ``niceness`` steps nicer (Linux: threads are tasks).

    Model work then yields the CPU to the reactor thread whenever both are runnable,
    so API latency holds while models saturate the cores. Returns False where the
    platform cannot do it (the call is then a no-op).
    """
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + niceness))
    except OSError:
        return False
    return True
