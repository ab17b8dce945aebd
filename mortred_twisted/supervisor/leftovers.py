"""At start: children left on the supervisor's ports by an earlier run (reactor thread).

A supervisor that was killed (SIGKILL, OOM) before it could stop its children may
leave some behind (each child also watches its parent: see
:mod:`~mortred_twisted.supervisor.child_contract`; this is the second line). Before
autostart, :func:`stop_leftovers` looks at the port of every child it manages:

* held by a process whose command line is exactly the one this supervisor would
  spawn there (same interpreter, launcher, plugin and config): a leftover of an
  earlier run of this control plane. It is stopped (SIGTERM, then SIGKILL after
  the grace) and the port is used.
* held by anything else: reported (pid and command when visible); that child is
  not started (its start is a ``start_failed`` naming the holder, see
  :class:`~mortred_twisted.supervisor.monitor.ManagedServer`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger

from mortred_twisted.pids import pid_alive
from mortred_twisted.supervisor.ports import Holder, describe_holders, listeners, port_free

log = Logger()

#: How often a stopping leftover is looked at.
POLL_S = 0.05


def classify(
    servers: Iterable[Any],
    holders_of: Callable[[str, int], list[Holder] | None],
) -> tuple[list[tuple[Any, Holder]], list[tuple[Any, str]]]:
    """``(ours, others)``: for each server with a ``listen`` address whose port is
    held (``holders_of`` answers None for a free port), the leftovers of our own
    spawn command, and a description of anything else holding it."""
    ours: list[tuple[Any, Holder]] = []
    others: list[tuple[Any, str]] = []
    for server in servers:
        if server.listen is None:
            continue
        held = holders_of(*server.listen)
        if held is None:
            continue
        mine = [h for h in held if h.argv == tuple(server.spec.argv)]
        strangers = [h for h in held if h not in mine]
        ours.extend((server, h) for h in mine)
        if strangers or not held:
            others.append((server, describe_holders(strangers)))
    return ours, others


def holders_on(host: str, port: int) -> list[Holder] | None:
    """None when ``host:port`` is free, else the visible processes listening there."""
    if port_free(host, port):
        return None
    return listeners(port)


async def _stop_one(holder: Holder, clock: IReactorTime, grace: float) -> None:
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    waited = 0.0
    while pid_alive(holder.pid):
        if waited >= grace:
            log.warn("leftover {pid} still alive after {g} s: SIGKILL", pid=holder.pid, g=grace)
            try:
                os.kill(holder.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            grace = float("inf")
        await deferLater(clock, POLL_S, lambda: None)
        waited += POLL_S


def stop_leftovers(
    servers: Iterable[Any],
    clock: IReactorTime,
    grace: float,
    holders_of: Callable[[str, int], list[Holder] | None] = holders_on,
) -> defer.Deferred[list[str]]:
    """Stop our leftovers on the servers' ports, report the others; fires with one
    line per finding (also logged)."""
    ours, others = classify(list(servers), holders_of)
    lines: list[str] = []
    for server, holder in ours:
        line = f"{server.id}: stopping a leftover of an earlier run ({holder.describe()})"
        lines.append(line)
        server.logs.note(line)
        log.warn("{line}", line=line)
    for server, who in others:
        host, port = server.listen
        line = f"{server.id}: port {port} on {host} is held by {who}: refusing to start it there"
        lines.append(line)
        server.logs.note(line)
        log.error("{line}", line=line)
    if not ours:
        return defer.succeed(lines)
    d = defer.gatherResults(
        [defer.Deferred.fromCoroutine(_stop_one(h, clock, grace)) for _, h in ours],
        consumeErrors=True,
    )
    d.addCallback(lambda _: lines)
    return d
