"""The internal token goes only to verified children (reactor thread).

The gateway and the supervisor's own relay send ``Authorization: Bearer <internal
token>`` to model ports. A port is just a number: whatever process listens there
receives it. :class:`TrustGate` wraps the upstream client they send with and lets a
request to a supervised child's origin (``http://host:port``) through only while
the supervisor reports that child **trusted**: ready, its process alive, and (for a
model) proven to be this spawn (:mod:`~mortred_twisted.supervisor.child_contract`).
Anything else fails as :class:`~mortred_twisted.http11.upstream.UpstreamUnavailable`
("not ready", with the child's state) before a connection is opened, so nothing,
and no token, reaches a stranger; the callers answer it like a refused
connection (another replica, a cold start, or 503 with the reason).

Origins that are not supervised children (``[gateway.upstreams]`` remote URLs, a
gateway run by hand) pass: the view answers None for them.

Two views:

* :class:`LocalChildren` in the supervisor: the managed servers themselves.
* :class:`RemoteChildren` in the gateway child: the supervisor's
  ``GET /api/v1/children`` (internal token), read at start, every
  :data:`REFRESH_S`, and when a request meets an origin not trusted in the last
  reading: that request waits for a reading that *starts after* it (so a replica
  the supervisor has just reported ready, to a cold-start wake, is seen), shared
  by every request that missed meanwhile, at most one per :data:`MIN_GAP_S`. Each
  trusted child's process is watched with a pidfd (Linux): its exit withdraws the
  trust at once, before the port can be taken by another process, so a restart or
  a squat is never sent anything until the supervisor has verified the new process.
  Without pidfds, ``kill(pid, 0)`` is asked at each request.

A supervisor that cannot be read trusts nothing (fail closed).
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.http11.upstream import UpstreamUnavailable
from mortred_twisted.pids import pid_alive

log = Logger()

#: Seconds between two readings of the supervisor's children (gateway side).
REFRESH_S = 1.0
#: The least time between the starts of two readings (a burst of requests to a
#: model that is down costs the supervisor at most one reading per gap).
MIN_GAP_S = 0.02


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (what a child is keyed by)."""
    start = url.find("://")
    if start < 0:
        return url
    slash = url.find("/", start + 3)
    return url if slash < 0 else url[:slash]


@dataclass(frozen=True)
class Verdict:
    """May this origin be sent the token? ``reason`` says why not."""

    ok: bool
    reason: str = ""


#: The answer for every trusted origin (one object: the gateway asks per request).
TRUSTED = Verdict(True)


class TrustGate:
    """An upstream client (``request``/``stream``) that sends only to trusted
    origins; every other attribute is the wrapped client's."""

    def __init__(self, client: Any, view: Any) -> None:
        self._client = client
        self.view = view
        #: requests refused because their origin was not trusted
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def request(
        self, method: str, url: str, headers: dict[bytes, list[bytes]], body: bytes | None = None
    ) -> defer.Deferred[Any]:
        verdict = self.view.verdict(origin_of(url))
        if verdict is None or verdict.ok:  # the hot path: no closure, no Deferred
            return self._client.request(method, url, headers, body)
        return self._after_refresh(url, lambda: self._client.request(method, url, headers, body))

    def stream(self, method: str, url: str, headers: dict[bytes, list[bytes]]) -> Any:
        verdict = self.view.verdict(origin_of(url))
        if verdict is None or verdict.ok:
            return self._client.stream(method, url, headers)
        return self._after_refresh(url, lambda: self._client.stream(method, url, headers))

    def _after_refresh(
        self, url: str, send: Callable[[], defer.Deferred[Any]]
    ) -> defer.Deferred[Any]:
        """Not trusted in the last reading: decide on a reading taken after now."""
        origin = origin_of(url)
        d = self.view.refresh()

        def again(_: Any) -> Any:
            latest = self.view.verdict(origin)
            if latest is None or latest.ok:
                return send()
            self.refused += 1
            raise UpstreamUnavailable(f"not ready ({latest.reason})")

        return d.addCallback(again)


class LocalChildren:
    """The supervisor's view: its managed servers by origin (see the module doc)."""

    def __init__(self, servers: Iterable[Any]) -> None:
        self._by_origin = {s.origin: s for s in servers}

    def verdict(self, origin: str) -> Verdict | None:
        server = self._by_origin.get(origin)
        if server is None:
            return None
        if server.trusted:
            return TRUSTED
        return Verdict(False, child_reason(server.state, server.ready, server.verified))

    def refresh(self) -> defer.Deferred[None]:
        return defer.succeed(None)


def child_reason(state: str, ready: bool, verified: bool) -> str:
    """What a client is told about a child it may not reach (no pids, no commands)."""
    if state == "running" and ready and not verified:
        return "not verified"
    if state == "running" and not ready:
        return "running, not ready"
    return state


def children_document(servers: Iterable[Any]) -> dict[str, Any]:
    """``GET /api/v1/children``: each model child's origin, pid and trust."""
    return {
        "children": [
            {
                "id": s.id,
                "url": s.origin,
                "pid": s.pid,
                "state": s.state,
                "ready": s.ready,
                "verified": s.verified,
                "trusted": s.trusted,
            }
            for s in servers
        ]
    }


@dataclass
class _Known:
    pid: int | None
    trusted: bool
    reason: str
    watch: Any = None


class _PidWatch:
    """A pidfd in the reactor: ``on_exit`` once the process has ended; :meth:`alive`
    asks the kernel now (one ``poll``, ~0.5 us: the reactor may not have read the
    pidfd yet when a request arrives in the same turn)."""

    def __init__(self, reactor: Any, fd: int, on_exit: Callable[[], None]) -> None:
        self.reactor = reactor
        self.fd = fd
        self.on_exit = on_exit
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        reactor.addReader(self)

    def alive(self) -> bool:
        return self.fd >= 0 and not self._poll.poll(0)

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "pidfd"

    def doRead(self) -> None:
        self.close()
        self.on_exit()

    def connectionLost(self, reason: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            self.reactor.removeReader(self)
            os.close(self.fd)
            self.fd = -1


class RemoteChildren:
    """The gateway's view, read from the supervisor (see the module docstring)."""

    def __init__(
        self,
        http: Any,
        supervisor_url: str,
        internal_token: str,
        reactor: Any,
        *,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._http = http
        self._url = supervisor_url.rstrip("/") + "/api/v1/children"
        self._headers = {b"authorization": [b"Bearer " + internal_token.encode("latin-1")]}
        self._reactor = reactor
        self._clock: IReactorTime = reactor
        self._known: dict[str, _Known] = {}
        self._read_at: float | None = None
        self._started_at: float | None = None
        self._reading: defer.Deferred[None] | None = None
        self._timer: Any = None
        #: callers waiting for the next reading to start
        self._next: list[defer.Deferred[None]] = []
        self._failure: str | None = None
        self._loop = LoopingCall(self.refresh)
        self._loop.clock = reactor
        self._refresh_s = refresh_s
        self._pidfd = hasattr(os, "pidfd_open")

    def start(self) -> None:
        if not self._loop.running:
            self._loop.start(self._refresh_s, now=True)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for known in self._known.values():
            if known.watch is not None:
                known.watch.close()

    def verdict(self, origin: str) -> Verdict | None:
        known = self._known.get(origin)
        if known is not None and known.trusted and known.watch is not None:
            if known.watch.alive():
                return TRUSTED  # the hot path: a trusted child, alive now
            known.watch.doRead()  # it has ended: withdraw the trust now
        if self._read_at is None:  # nothing read yet: trust nothing supervised
            return Verdict(False, self._failure or "not verified yet")
        if known is None:  # not a child; unless nothing could be read: then fail closed
            return None if self._failure is None or self._known else Verdict(False, self._failure)
        unwatched = known.trusted and known.watch is None and known.pid is not None
        if unwatched and not pid_alive(known.pid):  # no pidfd: ask the kernel each time
            known.trusted, known.reason = False, "exited"
        return TRUSTED if known.trusted else Verdict(False, known.reason)

    def refresh(self) -> defer.Deferred[None]:
        """Fires once a reading that started after this call has been taken in
        (one reading at a time; callers that come while one runs share the next).
        Never fails."""
        waiter: defer.Deferred[None] = defer.Deferred()
        self._next.append(waiter)
        self._schedule()
        return waiter

    def _schedule(self) -> None:
        if self._reading is not None or (self._timer is not None and self._timer.active()):
            return  # the reading in flight schedules the next when it settles
        gap = 0.0  # at least the end of this turn: misses of one turn share a reading
        if self._started_at is not None:
            gap = max(0.0, MIN_GAP_S - (self._clock.seconds() - self._started_at))
        self._timer = self._clock.callLater(gap, self._begin)

    def _begin(self) -> None:
        self._timer = None
        waiters, self._next = self._next, []
        self._started_at = self._clock.seconds()
        reading = self._http.request("GET", self._url, self._headers, None)
        self._reading = reading
        reading.addCallbacks(self._read, self._unread)
        reading.addBoth(self._settled, waiters)

    def _read(self, response: Any) -> None:
        if response.code != 200:
            raise ValueError(f"HTTP {response.code}")
        doc = json.loads(response.body)
        fresh: dict[str, _Known] = {}
        for child in doc["children"]:
            origin = origin_of(str(child["url"]))
            pid = child.get("pid")
            trusted = bool(child.get("trusted")) and isinstance(pid, int)
            reason = child_reason(
                str(child.get("state")), bool(child.get("ready")), bool(child.get("verified"))
            )
            old = self._known.pop(origin, None)
            if old is not None and old.watch is not None and (old.pid != pid or not trusted):
                old.watch.close()
                old.watch = None
            known = _Known(pid, trusted, reason, old.watch if old is not None else None)
            if trusted and known.watch is None and self._pidfd:
                known.watch = self._watch(origin, pid)
                if known.watch is None:  # already gone
                    known.trusted, known.reason = False, "exited"
            fresh[origin] = known
        for gone in self._known.values():
            if gone.watch is not None:
                gone.watch.close()
        self._known = fresh
        self._failure = None

    def _watch(self, origin: str, pid: int) -> _PidWatch | None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:  # no pidfds here (old kernel, another pid namespace)
            self._pidfd = False
            return None

        def exited() -> None:
            known = self._known.get(origin)
            if known is not None and known.pid == pid:
                known.trusted, known.reason, known.watch = False, "exited", None

        return _PidWatch(self._reactor, fd, exited)

    def _unread(self, failure: Failure) -> None:
        why = f"supervisor not reachable: {failure.getErrorMessage()}"
        if why != self._failure:
            log.warn("cannot read the supervisor's children ({why}): trusting none", why=why)
        self._failure = why
        for known in self._known.values():  # fail closed
            known.trusted, known.reason = False, "not verified (supervisor not reachable)"

    def _settled(self, result: Any, waiters: list[defer.Deferred[None]]) -> None:
        if isinstance(result, Failure):
            self._unread(result)
        self._read_at = self._clock.seconds()
        self._reading = None
        for w in waiters:
            w.callback(None)
        if self._next:
            self._schedule()
