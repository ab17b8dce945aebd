"""When to retry, and how long to wait first (pure: no IO, time and randomness injected).

Both clients run the same loop around one request::

    attempt = policy.start(now)
    while True:
        outcome = send()                      # an answer, or a connection error
        delay = attempt.next_delay(now, retryable, retry_after)
        if delay is None: raise / return      # final
        sleep(delay)

What is retryable is decided here too (:func:`retryable_status`, :class:`Safety`):

* ``GET`` and ``DELETE`` (poll, wait, result, listing, events, cancel: a cancel is
  idempotent) on connection errors and on 429, 502, 503 and 504;
* a submit only when it carries an ``Idempotency-Key`` (the server answers a replay
  with the first job and ``Idempotent-Replayed: true``, so a lost answer never
  creates a second job), on the same conditions;
* anything else (sync inference, a submit without a key) only when the server says
  it did nothing: a 429 (backpressure, rate limit, queue full) or a connection that
  was refused before the request was sent.

Delays: ``base * 2**n`` capped at ``cap``, with "equal jitter" (half fixed, half
random, so retries of many clients spread out but never collapse to zero), or the
server's ``Retry-After`` when it gave one (seconds or an HTTP date), never more
than what is left of the total ``deadline``: a wait that would end past it is not
started, and the last error is raised at once.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

#: Statuses that say "try again later" (nothing was done, or a proxy lost the answer).
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class Safety(enum.Enum):
    """How safe it is to send a request twice."""

    #: GET, DELETE, a submit with an Idempotency-Key: retried on every retryable outcome.
    REPEATABLE = "repeatable"
    #: sync inference, a submit without a key: retried only when provably not done.
    ONCE = "once"


def retryable_status(status: int, safety: Safety) -> bool:
    """Whether an answer with ``status`` may be retried for a request of ``safety``."""
    if safety is Safety.REPEATABLE:
        return status in RETRYABLE_STATUSES
    return status == 429


def retryable_error(exc: BaseException, safety: Safety) -> bool:
    """Whether a connection error may be retried. A refused connection never reached
    the server, so it is retryable for every request; any other error (a reset, a
    timeout, an answer cut off) only for a repeatable one."""
    if safety is Safety.REPEATABLE:
        return isinstance(exc, OSError)
    return isinstance(exc, ConnectionRefusedError)


def parse_retry_after(value: str | None, now_epoch: float) -> float | None:
    """``Retry-After`` in seconds from now: delta-seconds (``"3"``, ``"1.5"``) or an
    HTTP date (``"Wed, 21 Oct 2015 07:28:00 GMT"``) against ``now_epoch`` (unix
    seconds); a date in the past is 0. ``None`` when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds != seconds or seconds in (float("inf"), float("-inf")):  # nan, inf
            return None
        return max(0.0, seconds)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:  # RFC 9110: HTTP dates are GMT
        return None
    return max(0.0, when.timestamp() - now_epoch)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retries of one request.

    ``max_attempts`` counts the first try (1 = never retry); ``deadline`` (seconds)
    bounds the whole call, waits included, from the first try; ``base``/``cap`` shape
    the exponential backoff; ``max_retry_after``: a server's ``Retry-After`` longer
    than this is not waited for (the error is raised).
    """

    max_attempts: int = 6
    deadline: float = 60.0
    base: float = 0.1
    cap: float = 5.0
    max_retry_after: float = 60.0

    def start(self, now: float, rng: Callable[[], float] | None = None) -> Attempts:
        """The retry state of one call that starts at ``now`` (monotonic seconds);
        ``rng`` returns floats in [0, 1) (default: :func:`random.random`)."""
        return Attempts(self, now, rng or random.random)

    def backoff(self, retry: int, rng: Callable[[], float]) -> float:
        """The wait before retry number ``retry`` (0-based): equal jitter over
        ``min(cap, base * 2**retry)``."""
        ceiling = min(self.cap, math.ldexp(self.base, retry))  # base * 2**retry
        return ceiling / 2 + rng() * ceiling / 2


#: The policy of a client that must not retry at all.
NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass
class Attempts:
    """The retry state of one call (not thread-safe; one per call)."""

    policy: RetryPolicy
    started: float
    rng: Callable[[], float]
    tries: int = field(default=1)

    def next_delay(
        self, now: float, retryable: bool, retry_after: float | None = None
    ) -> float | None:
        """Seconds to wait before the next try, or ``None`` when this outcome is
        final (not retryable, attempts used up, Retry-After too long, or the wait
        would end past the deadline). Counts the try it allows."""
        if not retryable or self.tries >= self.policy.max_attempts:
            return None
        if retry_after is not None:
            if retry_after > self.policy.max_retry_after:
                return None
            delay = retry_after
        else:
            delay = self.policy.backoff(self.tries - 1, self.rng)
        if now + delay - self.started > self.policy.deadline:
            return None
        self.tries += 1
        return delay

    def remaining(self, now: float) -> float:
        """Seconds left of the deadline (never negative)."""
        return max(0.0, self.policy.deadline - (now - self.started))

    def reset(self, now: float) -> None:
        """Start over (a stream that delivered events again: its next drop is a
        fresh failure, not one more of the same)."""
        self.started = now
        self.tries = 1
