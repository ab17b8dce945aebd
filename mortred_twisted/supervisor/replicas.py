"""``ReplicaGroup``: the ``replicas = N`` processes of one catalog id (reactor thread).

Each replica is its own :class:`~mortred_twisted.supervisor.monitor.ManagedServer`
(id ``<id>@<n>``, port ``port + n - 1``, its own log file), monitored and restarted
on its own. The group stands where a single server would — in the supervisor, the
status API, the metrics — so operator actions on ``<id>`` act on every replica,
and the status of ``<id>`` lists each replica under ``"replicas"``.

An **autoscaled** group (``floor`` given: its ``min_replicas``) holds a replica per
port up to ``max_replicas`` but runs only some: :meth:`ReplicaGroup.start` starts
the floor, :meth:`ReplicaGroup.scale_to` starts stopped members (then failed ones,
then those whose port was held) in index order or stops the least useful ones
(:func:`victims`: not ready first, then the idlest by busy workers, then the
highest-numbered), and :attr:`wanted` says
whether an operator has it on (a stop turns it off: the scaler then leaves it
alone until the next start).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from mortred_twisted.supervisor.monitor import ManagedServer

#: How replica states fold into the group's: the first one any replica is in wins.
_PRECEDENCE = ("running", "starting", "backoff", "failed", "start_failed", "stopped")
#: Member states that count as up (the scaler's current count).
_UP = frozenset({"starting", "running", "backoff"})


def victims(up: list[tuple[int, bool, int | None]], count: int) -> list[int]:
    """Which ``count`` members to stop, from ``(index, ready, busy workers)`` of the
    members up: those not ready first (they serve nothing yet), then the ready ones
    with the fewest busy workers (an unknown figure counts as busy: a replica whose
    load could not be read is not assumed idle), the highest index first on ties.
    A busy replica is stopped only when no idler one is left; its running work then
    has ``stop_grace_s`` to finish (pure)."""

    def cost(member: tuple[int, bool, int | None]) -> tuple[int, float, int]:
        index, ready, busy = member
        load = float("inf") if busy is None else float(busy)
        return (1 if ready else 0, load if ready else 0.0, -index)

    return [m[0] for m in sorted(up, key=cost)[:count]]


def replica_id(server_id: str, index: int) -> str:
    """``<id>@<n>`` for replica ``index`` (0-based) of ``server_id``."""
    return f"{server_id}@{index + 1}"


class ReplicaGroup:
    """N managed replicas of one id, shown and operated as one server."""

    def __init__(
        self, server_id: str, replicas: list[ManagedServer], *, floor: int | None = None
    ) -> None:
        if not replicas:
            raise ValueError("a replica group needs replicas")
        self.id = server_id
        self.replicas = replicas
        #: autoscaled: the replicas :meth:`start` starts (min_replicas); None: all
        self.floor = floor
        #: an operator's start turned the group on, a stop off (the scaler acts only
        #: while it is on)
        self.wanted = False
        first = replicas[0]
        self.kind = first.kind
        self.category = first.category

    @property
    def state(self) -> str:
        states = {r.state for r in self.replicas}
        return next(s for s in _PRECEDENCE if s in states)

    @property
    def ready(self) -> bool:
        """Ready while at least one replica is (the gateway routes around the others)."""
        return any(r.ready for r in self.replicas)

    @property
    def restart_count(self) -> int:
        return sum(r.restart_count for r in self.replicas)

    @property
    def pid(self) -> int | None:
        return self.replicas[0].pid

    @property
    def logs(self) -> Any:
        """The first replica's log (each replica's is ``logs/<id>@<n>.log``)."""
        return self.replicas[0].logs

    def up(self) -> list[ManagedServer]:
        """Members starting, running or waiting to restart, and not being stopped
        (what the count is)."""
        return [r for r in self.replicas if r.state in _UP and not r.stopping]

    def scale_to(
        self, count: int, busy: dict[int, int | None] | None = None
    ) -> list[defer.Deferred[bool]]:
        """Start or stop members until ``count`` are up; the start Deferreds (each
        fires True once that replica is ready). ``busy`` (member index -> busy
        workers, as the scaler read them) picks who stops (:func:`victims`). Stopped
        members are SIGTERMed and drain as at any stop (a Redis replica hands its
        claims back)."""
        up = self.up()
        if count < len(up):
            known = busy or {}
            members = [
                (self.replicas.index(r), r.ready, known.get(self.replicas.index(r))) for r in up
            ]
            for index in victims(members, len(up) - count):
                self.replicas[index].stop()
            return []
        idle = [r for r in self.replicas if r.state == "stopped"]
        idle += [r for r in self.replicas if r.state == "failed"]
        idle += [r for r in self.replicas if r.state == "start_failed"]
        return [r.start() for r in idle[: count - len(up)]]

    def member(self, server_id: str) -> ManagedServer | None:
        return next((r for r in self.replicas if r.id == server_id), None)

    def status(self) -> dict[str, Any]:
        doc = self.replicas[0].status()
        doc.update(
            id=self.id,
            state=self.state,
            ready=self.ready,
            restart_count=self.restart_count,
            ready_replicas=sum(1 for r in self.replicas if r.ready),
            replicas=[r.status() for r in self.replicas],
        )
        return doc

    def start(self) -> defer.Deferred[bool]:
        """Start every replica (autoscaled: the floor, or the replicas already up);
        True once those are ready."""
        self.wanted = True
        if self.floor is None:
            starting = [r.start() for r in self.replicas]
        else:
            up = self.up()
            starting = [r.start() for r in up] + self.scale_to(max(self.floor, len(up)))
        d = defer.gatherResults(starting, consumeErrors=True)
        return d.addCallback(all)

    def stop(self) -> defer.Deferred[None]:
        self.wanted = False
        d = defer.gatherResults([r.stop() for r in self.replicas], consumeErrors=True)
        return d.addCallback(lambda _: None)

    def restart(self) -> defer.Deferred[bool]:
        """Restart the replicas one after another, so the id keeps serving."""

        members = self.replicas if self.floor is None else self.up()
        self.wanted = True

        async def one_by_one() -> bool:
            ok = True
            for replica in members:
                ok = bool(await replica.restart()) and ok
            return ok

        return defer.Deferred.fromCoroutine(one_by_one())
