"""Per-key token buckets, and the server's per-IP limit on POSTs."""

from __future__ import annotations

import base64

from mortred_twisted.http.ratelimit import RateLimiter
from tests.http.test_model_server_app import call, make_app


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_burst_then_asks_to_retry() -> None:
    """At 2 qps, two requests pass, the third is told to retry after 1 s."""
    clock = Clock()
    limiter = RateLimiter(2, clock=clock)
    assert limiter.check("a") == 0 and limiter.check("a") == 0
    assert limiter.check("a") == 1
    clock.now += 0.5
    assert limiter.check("a") == 0


def test_keys_are_independent_and_bounded() -> None:
    """One key's bucket does not affect another's; old keys are dropped past max_keys."""
    clock = Clock()
    limiter = RateLimiter(1, clock=clock, max_keys=2)
    assert limiter.check("a") == 0 and limiter.check("a") >= 1
    assert limiter.check("b") == 0
    limiter.check("c")  # evicts "a", the least recently seen
    assert limiter.check("a") == 0


def test_slow_rate_retry_after_rounds_up() -> None:
    """At 0.1 qps the wait is 10 s."""
    limiter = RateLimiter(0.1, clock=Clock())
    assert limiter.check("k") == 0
    assert limiter.check("k") == 10


def test_server_rate_limits_posts_per_client_with_retry_after() -> None:
    """With rate_limit_qps=1 the second POST from one client is 429 with Retry-After."""
    app, _clock, _threads, stub = make_app(RateLimiter(1, clock=Clock()), rate_limit_qps=1)
    body = {"images": [base64.b64encode(b"x").decode()]}
    assert call(stub, "POST", "/jobs", body)[0] == 202
    code, headers, doc = call(stub, "POST", "/jobs", body)
    assert code == 429 and headers.getRawHeaders("retry-after") == ["1"]
    assert "rate limit exceeded" in doc["error"]
    assert app.runtime.ledger.queue_depth == 1, "the refused submit was not admitted"
