"""Per-key token buckets for ``rate_limit_qps`` (pure; time from an injected clock).

Bucket capacity is ``max(1, qps)``: a key may burst one second's worth of requests.
Not thread-safe: the gateway calls it on the reactor thread only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    qps: float
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets by key name; a reload that changes a key's qps resets its bucket."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def acquire(self, name: str, qps: float) -> int | None:
        """Take one token: None when allowed, else the ``Retry-After`` in whole seconds
        (>= 1). ``qps <= 0`` is unlimited."""
        if qps <= 0:
            return None
        now = self._clock()
        capacity = max(1.0, qps)
        bucket = self._buckets.get(name)
        if bucket is None or bucket.qps != qps:
            bucket = self._buckets[name] = _Bucket(qps, capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * qps)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / qps))

    def forget_except(self, names: set[str]) -> None:
        """Drop buckets of keys that no longer exist (after a reload)."""
        for name in list(self._buckets):
            if name not in names:
                del self._buckets[name]
