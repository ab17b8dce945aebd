"""Autoscaling policy: how many replicas one model id should run (pure).

No reactor, no IO: :meth:`AutoscalePolicy.decide` takes one :class:`Measurement`
and the time (``now``, seconds of any monotonic clock) and returns a
:class:`Decision`: the desired replica count and why. The caller
(:mod:`mortred_twisted.supervisor.scaler`) measures, acts and reports.

**Load** is the backlog (pending + running jobs of the id in the shared job store)
plus the synchronous requests in flight on its replicas plus the requests gateways
hold for a cold start (``waiting``: not admitted anywhere yet, but demand). The
**raw** count for one measurement is ``ceil(load / target_backlog_per_replica)`` clamped to
``[max(min_replicas, 1), max_replicas]`` (zero is reached only by the idle rule).

Rules, in order (the first that applies decides):

1. **Lost measurement** (``load`` unknown): hold the current count and forget the
   history, so neither window nor the idle clock spans a gap (never scale down on a
   missing figure); at zero with requests held, one replica (a cold start).
2. **Cold start**: no replica is up or starting and there is load (a waiting
   request is enough): the raw count at once (within ``max_step``), whatever
   the windows and cooldown.
3. **Idle to zero**: with ``min_replicas = 0``, no load for ``idle_to_zero_s``: 0.
4. **Bounds**: a count outside ``[max(min_replicas, 1), max_replicas]`` is brought
   inside at once.
5. **Cooldown**: within ``cooldown_s`` of the last change: hold.
6. **Scale up**: the raw count stayed above the current one for the whole
   ``scale_up_window_s``: up to the lowest raw count seen in that window.
7. **Scale down**: the raw count stayed below the current one for the whole
   ``scale_down_window_s``: down to the highest raw count seen in that window.

**Start failure hold**, over all of them: while a replica failed to become ready
within the last :meth:`~AutoscalePolicy.failure_hold_s` (twice the measured
start-up time, at least the cooldown), no rule raises the count (a model that
cannot start does not get ever more replicas, nor a restart every tick).

A change moves at most ``max_step`` replicas (0: no limit). Load that swings faster
than a window therefore never moves the count back and forth (the window's extreme
holds it), which is what keeps the policy from flapping. Not thread-safe: one
policy per model id, called from one thread.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mortred_twisted.config.control import AutoscaleSettings

__all__ = ["REASONS", "AutoscalePolicy", "AutoscaleSettings", "Decision", "Measurement"]

#: Decision reasons (the ``reason`` label of the supervisor's series).
REASONS = (
    "steady",
    "hold_no_measurement",
    "cold_start",
    "idle_to_zero",
    "hold_start_failed",
    "cooldown",
    "scale_up",
    "scale_down",
    "waiting_window",
    "bounds",
)


@dataclass(frozen=True)
class Measurement:
    """One look at a model id.

    ``backlog``: pending + running jobs in the job store (None: could not be read);
    ``inflight``: sync requests in flight on its replicas (None: unknown);
    ``current``: replicas up or starting (what the count is now);
    ``ready``: of those, the ready ones; ``waiting``: requests the gateway holds for
    a cold start; ``startup_s``: the measured start-up time of the id's replicas
    (None before the first one started); ``last_start_failure``: when a replica last
    failed to become ready (None: never).
    """

    backlog: int | None
    current: int
    inflight: int | None = 0
    ready: int = 0
    waiting: int = 0
    startup_s: float | None = None
    last_start_failure: float | None = None

    @property
    def load(self) -> int | None:
        if self.backlog is None or self.inflight is None:
            return None
        return self.backlog + self.inflight + self.waiting


@dataclass(frozen=True)
class Decision:
    """The desired count for this measurement and the rule that set it."""

    desired: int
    reason: str
    load: int | None
    raw: int | None

    def changes(self, current: int) -> bool:
        return self.desired != current


class AutoscalePolicy:
    """Windows, idle clock and cooldown of one model id (see the module docstring)."""

    def __init__(self, settings: AutoscaleSettings) -> None:
        self.settings = settings
        self._samples: deque[tuple[float, int]] = deque()  # (time, raw)
        self._first_sample: float | None = None
        self._idle_since: float | None = None
        self._last_change: float | None = None

    def raw(self, load: int) -> int:
        """Replicas ``load`` needs at the target, clamped (never 0: see rule 3)."""
        s = self.settings
        wanted = math.ceil(load / s.target_backlog_per_replica) if load > 0 else 0
        return max(max(s.min_replicas, 1), min(s.max_replicas, wanted))

    def failure_hold_s(self, startup_s: float | None) -> float:
        """How long a failed start holds scale-ups: twice the measured start-up time,
        at least the cooldown."""
        return max(self.settings.cooldown_s, 2.0 * (startup_s or 0.0))

    def decide(self, m: Measurement, now: float) -> Decision:
        """The desired count now (see the module docstring for the rules)."""
        load = m.load
        if load is None:
            self._forget()
            if m.current == 0 and m.waiting > 0 and not self._failed_lately(m, now):
                # Requests wait at zero: demand is certain even without the store.
                self._last_change = now
                return Decision(1, "cold_start", None, None)
            return Decision(m.current, "hold_no_measurement", None, None)
        raw = self.raw(load)
        self._remember(now, raw)
        if load > 0:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        decision = self._rules(m, now, load, raw)
        if decision.desired > m.current and self._failed_lately(m, now):
            return Decision(m.current, "hold_start_failed", load, raw)
        if decision.desired != m.current:
            self._last_change = now
        return decision

    def _rules(self, m: Measurement, now: float, load: int, raw: int) -> Decision:
        s = self.settings
        floor = max(s.min_replicas, 1)
        if m.current == 0 and load > 0:
            return Decision(self._step(0, raw), "cold_start", load, raw)
        if m.current == 0 and s.min_replicas == 0:
            return Decision(0, "steady", load, raw)
        idle = self._idle_since
        if s.min_replicas == 0 and idle is not None and now - idle >= s.idle_to_zero_s:
            return Decision(0, "idle_to_zero", load, raw)
        if not floor <= m.current <= s.max_replicas:
            return Decision(max(floor, min(s.max_replicas, m.current)), "bounds", load, raw)
        if raw == m.current:
            return Decision(m.current, "steady", load, raw)
        if self._last_change is not None and now - self._last_change < s.cooldown_s:
            return Decision(m.current, "cooldown", load, raw)
        if raw > m.current:
            low = self._extreme(now, s.scale_up_window_s, min)
            if low is None or low <= m.current:
                return Decision(m.current, "waiting_window", load, raw)
            return Decision(self._step(m.current, low), "scale_up", load, raw)
        high = self._extreme(now, s.scale_down_window_s, max)
        if high is None or high >= m.current:
            return Decision(m.current, "waiting_window", load, raw)
        return Decision(self._step(m.current, high), "scale_down", load, raw)

    def _failed_lately(self, m: Measurement, now: float) -> bool:
        failed = m.last_start_failure
        return failed is not None and now - failed < self.failure_hold_s(m.startup_s)

    # -- internals ----------------------------------------------------------------

    def _step(self, current: int, target: int) -> int:
        step = self.settings.max_step
        if step <= 0:
            return target
        return current + max(-step, min(step, target - current))

    def _remember(self, now: float, raw: int) -> None:
        if self._first_sample is None:
            self._first_sample = now
        self._samples.append((now, raw))
        horizon = max(self.settings.scale_up_window_s, self.settings.scale_down_window_s)
        # Keep one sample older than the horizon: it stood for the window's start.
        while len(self._samples) > 1 and now - self._samples[1][0] >= horizon:
            self._samples.popleft()

    def _extreme(
        self, now: float, window: float, pick: Callable[[Iterable[int]], int]
    ) -> int | None:
        """The min/max raw count over the last ``window`` seconds, or None while the
        history (since the last gap) is shorter than the window."""
        assert self._first_sample is not None
        if now - self._first_sample < window:
            return None
        inside = [(t, raw) for t, raw in self._samples if now - t <= window]
        values = [raw for _t, raw in inside]
        if not inside or inside[0][0] > now - window:
            # The last sample before the window was the level at the window's start.
            older = [raw for t, raw in self._samples if now - t > window]
            values.extend(older[-1:])
        return pick(values) if values else None

    def _forget(self) -> None:
        self._samples.clear()
        self._first_sample = None
        self._idle_since = None
