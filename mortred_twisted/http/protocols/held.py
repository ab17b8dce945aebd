"""A front door's held request: answered when its job ends (edge, reactor thread).

:func:`hold_until_done` parks on the job's named counter (as ``/wait`` does, with
the shared-store recheck), reads the result once the job is terminal and hands it to
the door's renderer. The returned Deferred is what the door returns to the
connection: a client that disconnects cancels it, and that cancels the job (what
``DELETE /jobs/{id}`` does, :meth:`JobRoutes.cancel_effects`), so a held request
leaves nothing running behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred

from mortred_twisted.jobs.store import then
from mortred_twisted.jobs.types import ResultLookup


def hold_until_done(jobs: Any, job_id: str, render: Callable[[ResultLookup], Any]) -> Any:
    """Park until ``job_id`` is terminal, then ``render`` its :class:`ResultLookup`."""
    rt = jobs.runtime
    waiting = rt.counters.counter(job_id, 1)

    def ended(snap: Any) -> None:
        if snap is not None and snap.terminal:  # ended before the counter was set
            rt.counters.count_by_name(job_id, None)

    checked = then(rt.store.snapshot(job_id), ended)
    if isinstance(checked, Deferred):
        checked.addErrback(lambda _f: None)

    def answer(_name: Any) -> Any:
        return then(rt.store.take_result(job_id), render)

    def left(failure: Any) -> Any:
        failure.trap(CancelledError)
        cancelled = then(rt.store.cancel(job_id), lambda out: jobs.cancel_effects(job_id, out[0]))
        if isinstance(cancelled, Deferred):
            cancelled.addErrback(lambda _f: None)
        return failure

    out: Deferred[Any] = waiting.addCallbacks(answer, left)
    return out
