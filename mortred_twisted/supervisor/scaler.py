"""``Scaler``: one autoscaled model id's loop in the supervisor (reactor thread).

Every ``interval_s`` it measures (:class:`Meter`: the backlog from the Redis job
store, the synchronous requests in flight on the ready replicas), asks the pure
:class:`~mortred_twisted.supervisor.autoscale.AutoscalePolicy`, and moves the
:class:`~mortred_twisted.supervisor.replicas.ReplicaGroup` to the desired count
(:meth:`ReplicaGroup.scale_to`: the idlest replicas by busy workers are stopped
first; a stopped replica gets SIGTERM and drains as at any stop — on Redis its
running jobs finish within the model's grace or are handed back to the queue, its
pending jobs were never its own). A tick never overlaps the previous one; the loop
acts only while the group is ``wanted`` (an operator's stop turns it off).

Each decision that changes the count or its reason is a log line; the last one is in
:meth:`Scaler.status` (``/api/v1/status``, ``mortredctl status``) and in the
supervisor's metrics (:mod:`~mortred_twisted.supervisor.metrics`).

**Cold start.** :meth:`Scaler.wake` (the gateway's ``POST /api/v1/servers/<id>/wake``
while it holds a request for an id with no replica up) counts a waiting request,
ticks at once and fires with the first ready replica's base URL, or None after
``cold_start_timeout_s``. The time from the first waiting request (or the cold-start
decision) to the first ready replica is the measured cold-start time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mortred_twisted.supervisor.autoscale import (
    AutoscalePolicy,
    AutoscaleSettings,
    Decision,
    Measurement,
)
from mortred_twisted.supervisor.replicas import ReplicaGroup

log = Logger()


@dataclass(frozen=True)
class Reading:
    """What a :class:`Meter` read: jobs admitted and not terminal, and of those the
    running ones (both None when the store could not be read)."""

    backlog: int | None
    running: int | None


class Meter(Protocol):
    """Reads one model id's figures; never raises (a failure is a None figure)."""

    def backlog(self) -> defer.Deferred[Reading]: ...

    def busy_workers(self, base_url: str) -> defer.Deferred[int | None]: ...


class Scaler:
    """See the module docstring. ``start`` after the group exists, ``stop`` at exit."""

    def __init__(
        self,
        group: ReplicaGroup,
        settings: AutoscaleSettings,
        meter: Meter,
        clock: IReactorTime,
        urls: Callable[[int], str],
    ) -> None:
        self.group = group
        self.settings = settings
        self.policy = AutoscalePolicy(settings)
        self.meter = meter
        self.clock = clock
        self._url_of = urls
        self.last: Decision | None = None
        self.last_at: float | None = None
        self.backlog: int | None = None
        self.inflight: int | None = None
        self.decisions: Counter[str] = Counter()
        self.cold_start_s: float | None = None
        self.cold_starts = 0
        self._cold_since: float | None = None
        self._waiters: list[defer.Deferred[str | None]] = []
        self._ticking = False
        self._loop = LoopingCall(self.tick)
        self._loop.clock = clock

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        if not self._loop.running:
            self._loop.start(self.settings.interval_s, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.callback(None)

    # -- views --------------------------------------------------------------------------

    @property
    def current(self) -> int:
        return len(self.group.up())

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def startup_s(self) -> float | None:
        """The last measured start-up time of any replica of the id (None: none yet)."""
        times = [r.startup_s for r in self.group.replicas if r.startup_s is not None]
        return max(times) if times else None

    def retry_after_s(self) -> int:
        """What a refused client is told to wait: the measured start-up time (or the
        cold-start bound before any was measured), at least one second."""
        startup = self.startup_s()
        return max(1, round(startup if startup is not None else self.settings.cold_start_timeout_s))

    def status(self) -> dict[str, Any]:
        """The ``autoscale`` entry of the id in ``/api/v1/status``."""
        last = self.last
        return {
            "min_replicas": self.settings.min_replicas,
            "max_replicas": self.settings.max_replicas,
            "current": self.current,
            "ready": sum(1 for r in self.group.replicas if r.ready and not r.stopping),
            "desired": last.desired if last else None,
            "reason": last.reason if last else None,
            "backlog": self.backlog,
            "inflight": self.inflight,
            "waiting": self.waiting,
            "startup_s": _rounded(self.startup_s()),
            "cold_start_s": _rounded(self.cold_start_s),
            "cold_starts": self.cold_starts,
            "active": self.group.wanted,
        }

    # -- the loop -------------------------------------------------------------------------

    def tick(self) -> defer.Deferred[Decision | None]:
        """Measure, decide, act once (a tick while one runs is skipped: None)."""
        if self._ticking:
            return defer.succeed(None)
        self._ticking = True
        d = defer.Deferred.fromCoroutine(self._tick())

        def done(result: Any) -> Any:
            self._ticking = False
            return result

        d.addBoth(done)
        d.addErrback(lambda f: log.failure("autoscale {id}: tick failed", f, id=self.group.id))
        return d

    async def _tick(self) -> Decision | None:
        reading = await self.meter.backlog()
        replicas = self.group.replicas
        ready = [i for i, r in enumerate(replicas) if r.ready and not r.stopping]
        # Draining replicas still run jobs that hold leases (counted in
        # ``reading.running``): their busy workers are read too, or the subtraction
        # below would take their jobs off the ready replicas' sync requests.
        draining = [i for i, r in enumerate(replicas) if r.stopping and r.pid is not None]
        read = ready + draining
        busy = await defer.gatherResults(
            [self.meter.busy_workers(self._url_of(i)) for i in read], consumeErrors=True
        )
        by_index = dict(zip(read, busy, strict=True))
        self.backlog = reading.backlog
        inflight: int | None = None
        if reading.running is not None:
            # Busy workers not running a job serve sync requests; an unreadable
            # replica counts none (the backlog alone then decides).
            inflight = max(0, sum(b for b in busy if b is not None) - reading.running)
        self.inflight = inflight
        if not self.group.wanted:
            return None
        failures = [r.last_start_failure for r in self.group.replicas if r.last_start_failure]
        m = Measurement(
            backlog=reading.backlog,
            inflight=inflight,
            current=self.current,
            ready=len(ready),
            waiting=self.waiting,
            startup_s=self.startup_s(),
            last_start_failure=max(failures) if failures else None,
        )
        now = self.clock.seconds()
        decision = self.policy.decide(m, now)
        self._record(decision, m)
        if decision.desired != m.current:
            if m.current == 0 and decision.desired > 0 and self._cold_since is None:
                self._cold_since = now
            for started in self.group.scale_to(decision.desired, by_index):
                started.addCallback(self._replica_started)
        return decision

    def _record(self, decision: Decision, m: Measurement) -> None:
        previous = self.last
        self.last, self.last_at = decision, self.clock.seconds()
        self.decisions[decision.reason] += 1
        if previous is None or (previous.desired, previous.reason) != (
            decision.desired,
            decision.reason,
        ):
            log.info(
                "autoscale {id}: {current} -> {desired} replicas ({reason}; backlog "
                "{backlog}, in flight {inflight}, waiting {waiting})",
                id=self.group.id,
                current=m.current,
                desired=decision.desired,
                reason=decision.reason,
                backlog=m.backlog,
                inflight=m.inflight,
                waiting=m.waiting,
            )

    # -- cold start ---------------------------------------------------------------------

    def wake(self) -> defer.Deferred[str | None]:
        """Fires with the base URL of a ready replica (at once when one is), or None
        when none is ready within ``cold_start_timeout_s`` or the scaler stops."""
        url = self._ready_url()
        if url is not None:
            return defer.succeed(url)
        if self._cold_since is None:
            self._cold_since = self.clock.seconds()
        waiter: defer.Deferred[str | None] = defer.Deferred()
        self._waiters.append(waiter)

        def expire() -> None:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                waiter.callback(None)

        timer = self.clock.callLater(self.settings.cold_start_timeout_s, expire)

        def settled(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            if waiter in self._waiters:  # cancelled by the caller
                self._waiters.remove(waiter)
            return result

        waiter.addBoth(settled)
        if self.group.wanted and self.current == 0:
            self.tick()
        return waiter

    def _ready_url(self) -> str | None:
        for i, replica in enumerate(self.group.replicas):
            if replica.ready and not replica.stopping:  # a draining one is going away
                return self._url_of(i)
        return None

    def _replica_started(self, ok: bool) -> bool:
        url = self._ready_url()
        if not ok or url is None:
            return ok
        if self._cold_since is not None:
            self.cold_start_s = self.clock.seconds() - self._cold_since
            self.cold_starts += 1
            self._cold_since = None
            log.info(
                "autoscale {id}: cold start took {s:.2f} s", id=self.group.id, s=self.cold_start_s
            )
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.callback(url)
        return ok


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
