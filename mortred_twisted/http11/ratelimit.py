"""Per-key token buckets: the one rate limiter of the gateway and the model ports (pure).

The gateway limits per API key (each key its own ``rate_limit_qps``); a model port
limits per client address (``rate_limit_qps`` of its config). Both call
:meth:`RateLimiter.acquire` with the key and its rate; time comes from an injected
clock. Lives in ``http/`` beside :mod:`~mortred_twisted.http11.auth` so both layers import
it. Not thread-safe: call from one thread (the reactor).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    qps: float
    tokens: float
    updated: float


class RateLimiter:
    """``qps`` requests per second per key, bursts up to ``max(1, qps)``.

    A key seen with a different ``qps`` than its bucket's (an API key whose limit a
    reload changed) starts a fresh bucket. At most ``max_keys`` buckets are kept (the
    least recently used is dropped), so a client spraying keys cannot grow memory.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, max_keys: int = 10_000
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def acquire(self, key: str, qps: float) -> int | None:
        """Take one token of ``key``: None when the request may pass, else the whole
        seconds to wait (>= 1, for ``Retry-After``). ``qps <= 0`` is unlimited."""
        if qps <= 0:
            return None
        now = self._clock()
        capacity = max(1.0, qps)
        bucket = self._buckets.get(key)
        if bucket is None or bucket.qps != qps:
            bucket = _Bucket(qps, capacity, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * qps)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / qps))

    def forget_except(self, keys: set[str]) -> None:
        """Drop the buckets of keys not in ``keys`` (API keys removed by a reload)."""
        for key in list(self._buckets):
            if key not in keys:
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)
