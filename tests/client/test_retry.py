"""The retry policy and Retry-After parsing: pure, on an injected clock and rng."""

from __future__ import annotations

from email.utils import formatdate

import pytest
from mortred_client.retry import (
    RetryPolicy,
    Safety,
    parse_retry_after,
    retryable_error,
    retryable_status,
)

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("3", 3.0), (" 1.5 ", 1.5), ("0", 0.0), ("-4", 0.0), (None, None), ("", None),
     ("soon", None), ("nan", None), ("inf", None)],
)  # fmt: skip
def test_retry_after_seconds(value: str | None, expected: float | None) -> None:
    """Retry-After as delta-seconds is read as seconds (never negative); junk is None."""
    assert parse_retry_after(value, NOW) == expected


def test_retry_after_http_date() -> None:
    """Retry-After as an HTTP date is the seconds from the injected now to it; a date in
    the past is 0."""
    assert parse_retry_after(formatdate(NOW + 7, usegmt=True), NOW) == pytest.approx(7.0)
    assert parse_retry_after(formatdate(NOW - 60, usegmt=True), NOW) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW) == 0.0


def test_backoff_doubles_with_equal_jitter_and_caps() -> None:
    """Each retry waits between half and all of min(cap, base * 2**n)."""
    policy = RetryPolicy(base=0.1, cap=1.0)
    assert [policy.backoff(n, lambda: 0.0) for n in range(6)] == [
        0.05, 0.1, 0.2, 0.4, 0.5, 0.5,
    ]  # fmt: skip
    assert [policy.backoff(n, lambda: 0.999999) for n in range(3)] == pytest.approx([0.1, 0.2, 0.4])


def test_attempts_stop_after_max_attempts() -> None:
    """max_attempts counts the first try: 3 attempts allow exactly 2 waits."""
    attempts = RetryPolicy(max_attempts=3, base=0.1).start(0.0, lambda: 0.5)
    assert attempts.next_delay(0.0, True) == pytest.approx(0.075)
    assert attempts.next_delay(0.1, True) == pytest.approx(0.15)
    assert attempts.next_delay(0.3, True) is None


def test_not_retryable_is_final_at_once() -> None:
    """An outcome that is not retryable gives no delay, whatever is left."""
    assert RetryPolicy().start(0.0).next_delay(0.0, False) is None


def test_retry_after_is_honoured_but_bounded_by_the_deadline() -> None:
    """A server's Retry-After replaces the backoff; a wait that would end past the
    deadline (or longer than max_retry_after) is not started."""
    policy = RetryPolicy(deadline=10.0, max_retry_after=5.0)
    attempts = policy.start(100.0, lambda: 0.0)
    assert attempts.next_delay(100.0, True, retry_after=2.0) == 2.0
    assert attempts.next_delay(102.0, True, retry_after=6.0) is None  # > max_retry_after
    assert attempts.next_delay(107.0, True, retry_after=4.0) is None  # ends at 111 > 110
    assert attempts.next_delay(107.0, True, retry_after=3.0) == 3.0  # ends at 110
    assert attempts.remaining(108.0) == 2.0


def test_reset_starts_the_count_again() -> None:
    """After reset (a stream that delivered events) the attempts and deadline restart."""
    attempts = RetryPolicy(max_attempts=2, deadline=1.0).start(0.0, lambda: 0.0)
    assert attempts.next_delay(0.0, True) is not None
    assert attempts.next_delay(0.0, True) is None
    attempts.reset(50.0)
    assert attempts.next_delay(50.5, True) is not None


def test_what_is_retryable() -> None:
    """GET/DELETE and keyed submits retry 429/502/503/504 and connection errors; a
    request that runs the model only a 429 or a refused connection."""
    rep, once = Safety.REPEATABLE, Safety.ONCE
    assert [s for s in (400, 404, 409, 429, 500, 502, 503, 504) if retryable_status(s, rep)] == [
        429, 502, 503, 504,
    ]  # fmt: skip
    assert [s for s in (429, 500, 502, 503, 504) if retryable_status(s, once)] == [429]
    assert retryable_error(ConnectionResetError(), rep)
    assert retryable_error(TimeoutError(), rep)
    assert retryable_error(ConnectionRefusedError(), once)
    assert not retryable_error(ConnectionResetError(), once)
    assert not retryable_error(ValueError(), rep)
