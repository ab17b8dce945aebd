"""Racing a Deferred against a reactor timer without losing ownership of it.

``twisted.internet.defer.race`` cancels the loser, which is right for a worker
acquisition (a cancelled acquire leaves the queue) and wrong for a model run (a
thread cannot be cancelled: its lease must be released when the thread returns,
not when the budget expires). :func:`within` lets the caller choose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

T = TypeVar("T")


class DeadlineExpired(Exception):
    """The budget ran out before the raced Deferred fired."""


def within(
    clock: IReactorTime,
    d: Deferred[T],
    seconds: float | None,
    *,
    cancel_on_expiry: bool,
    on_expiry: Callable[[], Any] | None = None,
) -> Deferred[T]:
    """A Deferred with ``d``'s outcome, or failing with :class:`DeadlineExpired`.

    ``seconds=None`` means no deadline (``d`` itself is returned). On expiry,
    ``on_expiry`` is called, then ``d`` is cancelled if ``cancel_on_expiry``;
    otherwise ``d`` keeps running and its late outcome is dropped here (callbacks
    the caller added to ``d`` itself still run). Cancelling the returned Deferred
    cancels the timer and, if ``cancel_on_expiry``, ``d``.
    """
    if seconds is None:
        return d

    def cancel(_out: Deferred[Any]) -> None:
        if timer.active():
            timer.cancel()
        if cancel_on_expiry:
            d.cancel()

    out: Deferred[T] = Deferred(cancel)

    def expire() -> None:
        if on_expiry is not None:
            on_expiry()
        if not out.called:
            out.errback(DeadlineExpired())
        if cancel_on_expiry:
            d.cancel()

    timer = clock.callLater(max(0.0, seconds), expire)

    def settle(result: T | Failure) -> None:
        if timer.active():
            timer.cancel()
        if not out.called:
            if isinstance(result, Failure):
                out.errback(result)
            else:
                out.callback(result)
        elif isinstance(result, Failure):
            result.trap(Exception)  # swallow late failures (cancellation included)
        return None

    d.addBoth(settle)
    return out
