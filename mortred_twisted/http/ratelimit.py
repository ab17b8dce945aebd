"""Token-bucket rate limiting per key (client IP, API key) — pure, injected clock."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """``qps`` requests per second per key, bursts up to ``burst`` (default: ``qps``).

    :meth:`check` returns 0 when the request may pass, else the whole seconds to
    wait (for ``Retry-After``). At most ``max_keys`` buckets are kept (least
    recently seen dropped), so a key-spraying client cannot grow memory.
    Not thread-safe: call from one thread (the reactor).
    """

    def __init__(
        self,
        qps: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if qps <= 0:
            raise ValueError("qps must be > 0")
        self.qps = qps
        self.burst = burst if burst is not None else max(1.0, qps)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def check(self, key: str) -> int:
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.qps)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return 0
        self._store(key, tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self.qps))

    def _store(self, key: str, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
