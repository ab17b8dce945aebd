"""Managed children and the supervisor that orders them (reactor thread only).

:class:`ManagedServer` is one child's lifecycle::

    stopped ─start─► starting ─ready probe ok─► running
       ▲                │  ▲                        │
       │   exit, policy │  └─── backoff (0.5 s…30 s) ◄┘ exit, policy says restart
       │   says stop    ▼
       └──────────── failed (crash loop, policy 'no' after a failure, never ready)

    stopped ─start─► start_failed (its port is held by another process: not spawned,
                     or the child exited "cannot listen"; not restarted, an operator's
                     start tries again)

Readiness is probed over HTTP (``/ready`` for models, ``/healthz`` for the gateway)
every ``probe_interval``; a running child whose probe fails stays ``running`` with
``ready: false``. A child not ready within ``ready_timeout`` is stopped and its exit
goes through the restart policy. ``stop`` is SIGTERM, then SIGKILL after ``grace``.

**Trust.** A child is its own process only: before a spawn, a port held by another
process (``port_check``) is a ``start_failed`` naming the holder (pid and command
when visible), and nothing is spawned; a child that exits
:data:`~mortred_twisted.supervisor.child_contract.EXIT_CANNOT_LISTEN` is a
``start_failed`` too. With ``verify_identity`` each spawn gets a fresh spawn key in
its environment and every probe a fresh challenge: a ``/ready`` answer is taken
only with the proof of that key (:class:`Impostor` otherwise: the port is answered
by another process, which is never counted as ready).

:class:`Supervisor` owns the gateway and the models (a model with ``replicas > 1`` is
a :class:`~mortred_twisted.supervisor.replicas.ReplicaGroup`, which stands in for a
``ManagedServer``): autostart with a concurrency limit, and shutdown in order (models
first, then the gateway). Everything is
injected (clock, spawner, prober), so tests drive it with ``task.Clock`` and fakes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import treq
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from mortred_twisted.supervisor.child_contract import (
    CHALLENGE_HEADER,
    EXIT_CANNOT_LISTEN,
    PROOF_HEADER,
    SPAWN_KEY_ENV,
    new_challenge,
    new_spawn_key,
    proves,
)
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.policy import ExitStatus, RestartTracker
from mortred_twisted.supervisor.process import ChildHandle, ProcessSpec, Spawner

log = Logger()

STATES = ("stopped", "starting", "running", "backoff", "failed", "start_failed")
STATE_VALUE = {s: i for i, s in enumerate(STATES)}


@dataclass(frozen=True)
class Impostor:
    """A probe answered by a process that could not prove it is the child."""

    detail: str


#: A probe's answer: ready or not, or (not ready, the reason the child gives), or
#: an impostor on the port.
ProbeAnswer = bool | tuple[bool, str | None] | Impostor
#: ``prober(url, spawn_key)``: with a key, the answer must prove it (else Impostor).
Prober = Callable[[str, str | None], "defer.Deferred[ProbeAnswer]"]
#: ``port_check(host, port)``: None when the port is free, else who holds it.
PortCheck = Callable[[str, int], str | None]


def _not_ready_reason(body: bytes) -> str | None:
    """The ``error`` a model's 503 ``/ready`` names (a load failure's reason)."""
    import json

    try:
        doc = json.loads(body)
    except ValueError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    return error[:2000] if isinstance(error, str) and error else None


def http_prober(http: Any, clock: IReactorTime, timeout: float = 2.0) -> Prober:
    """A prober: GET ``url`` → True on HTTP 200 within ``timeout`` seconds; on a 503,
    ``(False, reason)`` with the reason the model gives (why it failed to load).
    With a spawn key, the request carries a fresh challenge and any answer without
    its proof is an :class:`Impostor`."""

    def probe(url: str, key: str | None = None) -> defer.Deferred[ProbeAnswer]:
        headers = {}
        challenge = new_challenge() if key else b""
        if key:
            headers[CHALLENGE_HEADER] = [challenge]
        d = http.get(url, headers=headers, timeout=timeout, reactor=clock)

        def done(response: Any) -> defer.Deferred[ProbeAnswer]:
            if key:
                answer = response.headers.getRawHeaders(PROOF_HEADER, [None])[0]
                if not proves(key, challenge, answer):
                    return treq.content(response).addCallback(
                        lambda _: Impostor(
                            f"HTTP {response.code} without the proof of this spawn's key"
                        )
                    )
            ok = response.code == 200
            if response.code == 503:
                return treq.content(response).addCallback(
                    lambda body: (False, _not_ready_reason(body))
                )
            return treq.content(response).addCallback(lambda _: ok)

        d.addCallback(done)
        d.addErrback(lambda _: False)
        return d

    return probe


@dataclass(frozen=True)
class Timing:
    """Seconds: probe interval, readiness deadline, SIGTERM→SIGKILL grace."""

    probe_interval: float = 0.5
    ready_timeout: float = 600.0
    grace: float = 10.0


class ManagedServer:
    """One supervised child. Public methods return Deferreds; never raise on state."""

    def __init__(
        self,
        server_id: str,
        *,
        kind: str,
        spec: ProcessSpec,
        probe_url: str,
        tracker: RestartTracker,
        clock: IReactorTime,
        spawner: Spawner,
        prober: Prober,
        log_buffer: LogBuffer,
        timing: Timing = Timing(),
        category: str = "",
        listen: tuple[str, int] | None = None,
        port_check: PortCheck | None = None,
        verify_identity: bool = False,
    ) -> None:
        self.id = server_id
        #: the address the child listens on (host, port), when known
        self.listen = listen
        self.port_check = port_check
        self.verify_identity = verify_identity
        #: this spawn's secret (verify_identity), None between spawns
        self.spawn_key: str | None = None
        #: the process on the port proved it is this spawn (verify_identity) since
        #: its last probe; False between spawns and after an impostor's answer
        self.verified = False
        self.kind = kind
        self.category = category
        self.spec = spec
        self.probe_url = probe_url
        self.tracker = tracker
        self.clock = clock
        self.spawner = spawner
        self.prober = prober
        self.logs = log_buffer
        self.timing = timing
        self.state = "stopped"
        self.ready = False
        self.restart_count = 0
        self.spawns = 0
        self.last_exit: ExitStatus | None = None
        self.started_at: float | None = None
        #: seconds from the last spawn to its first ready probe (None before one)
        self.startup_s: float | None = None
        #: clock time of the last exit before ready that nobody asked for
        self.last_start_failure: float | None = None
        self.error: str | None = None
        #: why the child says it is not ready (its /ready 503's error), while it is not
        self.not_ready_reason: str | None = None
        self._handle: ChildHandle | None = None
        self._probe_call: IDelayedCall | None = None
        self._restart_call: IDelayedCall | None = None
        self._kill_call: IDelayedCall | None = None
        self._stopping = False
        self._start_after_stop = False
        self._ready_waiters: list[defer.Deferred[bool]] = []
        self._stop_waiters: list[defer.Deferred[None]] = []

    # -- views ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._handle.pid if self._handle is not None else None

    @property
    def origin(self) -> str:
        """``http://host:port`` the child serves (its probe URL's origin)."""
        scheme, _, rest = self.probe_url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"

    @property
    def trusted(self) -> bool:
        """May be sent the internal token: ready, and (when identities are checked)
        proven to be this spawn, its process alive."""
        return (
            self.ready and self._handle is not None and (self.verified or not self.verify_identity)
        )

    @property
    def stopping(self) -> bool:
        """SIGTERM sent, the exit not seen yet."""
        return self._stopping

    def status(self) -> dict[str, Any]:
        """The ``/api/v1/status`` entry of this child."""
        started = (
            datetime.datetime.fromtimestamp(self.started_at, datetime.UTC).isoformat()
            if self.started_at is not None
            else None
        )
        return {
            "id": self.id,
            "kind": self.kind,
            "category": self.category,
            "state": self.state,
            "ready": self.ready,
            "stopping": self._stopping,
            "pid": self.pid,
            "restart_count": self.restart_count,
            "last_exit": self.last_exit.to_json() if self.last_exit else None,
            "started_at": started,
            "startup_s": round(self.startup_s, 3) if self.startup_s is not None else None,
            "error": self.error or self.not_ready_reason,
        }

    # -- operator actions -------------------------------------------------------------

    def start(self) -> defer.Deferred[bool]:
        """Start (an operator's start clears a crash loop); fires True once ready,
        False if the child ends up stopped or failed first."""
        waiter: defer.Deferred[bool] = defer.Deferred()
        if self.state == "running" and self.ready:
            waiter.callback(True)
            return waiter
        self._ready_waiters.append(waiter)
        if self._stopping:
            self._start_after_stop = True
            return waiter
        if self.state in ("starting", "running"):
            return waiter
        self.tracker.reset()
        self.error = None
        self.not_ready_reason = None
        if self._restart_call is not None and self._restart_call.active():
            self._restart_call.cancel()
        self._restart_call = None
        self._spawn()
        return waiter

    def stop(self) -> defer.Deferred[None]:
        """SIGTERM, then SIGKILL after the grace period; fires when the child is gone."""
        if self._restart_call is not None and self._restart_call.active():
            self._restart_call.cancel()
        self._restart_call = None
        if self._handle is None:
            if self.state in ("backoff", "failed", "starting", "start_failed"):
                self._set_stopped()
            return defer.succeed(None)
        waiter: defer.Deferred[None] = defer.Deferred()
        self._stop_waiters.append(waiter)
        if not self._stopping:
            self._stopping = True
            self.logs.note(f"stopping pid {self.pid} (SIGTERM)")
            self._handle.signal("TERM")
            self._kill_call = self.clock.callLater(self.timing.grace, self._kill)
        return waiter

    def restart(self) -> defer.Deferred[bool]:
        """Stop, then start; fires like :meth:`start`."""
        d = self.stop()
        d.addCallback(lambda _: self.start())
        return d

    # -- internals ------------------------------------------------------------------------

    def _kill(self) -> None:
        self._kill_call = None
        if self._handle is not None:
            self.logs.note(f"pid {self.pid} still alive after {self.timing.grace} s: SIGKILL")
            self._handle.signal("KILL")

    def _where(self) -> str:
        if self.listen is None:
            return "its port"
        host, port = self.listen
        return f"{f'[{host}]' if ':' in host else host}:{port}"

    def _start_failed(self, error: str) -> None:
        """A start that cannot succeed by retrying: not restarted, not ready."""
        self.state = "start_failed"
        self.ready = False
        self.error = error
        self.last_start_failure = self.clock.seconds()
        self.logs.note(f"start failed: {error}")
        log.warn("{id}: start_failed ({error})", id=self.id, error=error)
        self._fire_ready(False)

    def _held_by(self) -> str | None:
        """Who holds the child's port now (None: free, or not checked)."""
        if self.listen is None or self.port_check is None:
            return None
        try:
            return self.port_check(*self.listen)
        except Exception as exc:  # a check that fails never blocks a start
            log.warn("{id}: port check failed: {exc}", id=self.id, exc=exc)
            return None

    def _spawn(self) -> None:
        self._restart_call = None
        holder = self._held_by()
        if holder is not None:
            self._start_failed(
                f"cannot listen on {self._where()}: address in use by {holder}; not started"
            )
            return
        self.state = "starting"
        self.ready = False
        self.started_at = self.clock.seconds()
        spec = self.spec
        self.spawn_key = None
        self.verified = False
        if self.verify_identity:
            self.spawn_key = new_spawn_key()
            spec = ProcessSpec(spec.argv, {**spec.env, SPAWN_KEY_ENV: self.spawn_key}, spec.cwd)
        try:
            handle = self.spawner.spawn(spec, self.logs)
        except Exception as exc:  # e.g. executable missing
            self.error = f"spawn failed: {exc}"
            self.logs.note(self.error)
            self._on_exit(ExitStatus(code=127), None)
            return
        self._handle = handle
        if self.spawns:
            self.restart_count += 1
        self.spawns += 1
        self.logs.note(f"started pid {handle.pid}: {' '.join(self.spec.argv[1:])}")
        handle.ended.addCallback(self._on_exit, handle)
        self._schedule_probe()

    def _schedule_probe(self) -> None:
        self._probe_call = self.clock.callLater(self.timing.probe_interval, self._probe)

    def _probe(self) -> None:
        self._probe_call = None
        handle = self._handle
        if handle is None or self._stopping:
            return
        d = defer.maybeDeferred(self.prober, self.probe_url, self.spawn_key)
        d.addErrback(lambda f: (log.failure("probe {url}", f, url=self.probe_url), False)[1])
        d.addCallback(self._probed, handle)

    def _probed(self, answer: ProbeAnswer, handle: ChildHandle) -> None:
        if handle is not self._handle or self._stopping:
            return
        if isinstance(answer, Impostor):
            # Another process answers on the child's port: never ready. Our child
            # cannot listen there; it exits "cannot listen" (start_failed).
            self.verified = False
            answer = (False, f"{self._where()} is answered by another process ({answer.detail})")
        elif self.spawn_key is not None and (answer is True or isinstance(answer, tuple)):
            self.verified = True  # an answer (not a failed connection) with the proof
        ok, reason = (answer, None) if isinstance(answer, bool) else answer
        if not ok and reason and reason != self.not_ready_reason:
            self.not_ready_reason = reason  # e.g. the model's load error, once per change
            self.logs.note(f"not ready: {reason}")
        if ok and not self.ready:
            if self.state == "starting" and self.started_at is not None:
                self.startup_s = self.clock.seconds() - self.started_at
            self.ready = True
            self.state = "running"
            self.error = None
            self.not_ready_reason = None
            self.logs.note(f"ready ({self.probe_url})")
            self._fire_ready(True)
        elif not ok and self.ready:
            self.ready = False
            self.logs.note(f"not ready ({self.probe_url})")
        elif not ok and self.state == "starting":
            assert self.started_at is not None
            if self.clock.seconds() - self.started_at > self.timing.ready_timeout:
                self.error = f"not ready after {self.timing.ready_timeout:.0f} s"
                if self.not_ready_reason:
                    self.error += f": {self.not_ready_reason}"
                self.logs.note(self.error + ": stopping it")
                handle.signal("TERM")
                self._kill_call = self.clock.callLater(self.timing.grace, self._kill)
                return
        self._schedule_probe()

    def _on_exit(self, status: ExitStatus, handle: ChildHandle | None) -> None:
        if handle is not None and handle is not self._handle:
            return
        self._handle = None
        for call in (self._probe_call, self._kill_call):
            if call is not None and call.active():
                call.cancel()
        self._probe_call = self._kill_call = None
        if self.state == "starting" and not self._stopping:
            self.last_start_failure = self.clock.seconds()
        self.ready = False
        self.last_exit = status
        self.spawn_key = None
        self.verified = False
        self.logs.note(status.describe())
        if (
            not self._stopping
            and status.code == EXIT_CANNOT_LISTEN
            and self.state in ("starting", "running")
        ):
            holder = self._held_by()
            self._start_failed(
                f"cannot listen on {self._where()}: address in use"
                + (f" by {holder}" if holder else "")
            )
            return
        if self._stopping:
            self._stopping = False
            start_again, self._start_after_stop = self._start_after_stop, False
            self.state = "stopped"
            if not start_again:
                self._fire_ready(False)
            waiters, self._stop_waiters = self._stop_waiters, []
            for w in waiters:
                w.callback(None)  # restart() calls start() from here
            if start_again and self._handle is None and self.state == "stopped":
                self.tracker.reset()
                self._spawn()
            return
        decision = self.tracker.on_exit(status, self.clock.seconds())
        if decision.restart:
            self.state = "backoff"
            self.logs.note(f"restarting in {decision.delay:g} s ({decision.reason})")
            self._restart_call = self.clock.callLater(decision.delay, self._spawn)
            return
        if decision.give_up or status.failed:
            self.state = "failed"
            self.error = self.error or decision.reason or status.describe()
            if decision.give_up:
                self.error = decision.reason
        else:
            self.state = "stopped"
        log.warn("{id}: {state} ({reason})", id=self.id, state=self.state, reason=decision.reason)
        self._fire_ready(False)

    def _set_stopped(self) -> None:
        self.state = "stopped"
        self.ready = False
        self._fire_ready(False)

    def _fire_ready(self, ok: bool) -> None:
        waiters, self._ready_waiters = self._ready_waiters, []
        for w in waiters:
            w.callback(ok)


class Supervisor:
    """The gateway plus every catalog model; ordering and concurrency live here."""

    def __init__(
        self,
        servers: list[ManagedServer],
        *,
        gateway: ManagedServer | None = None,
        start_concurrency: int = 2,
    ) -> None:
        self.gateway = gateway
        self.models = {s.id: s for s in servers}
        self.start_concurrency = start_concurrency
        self.closing = False
        #: model id -> its autoscaler (:mod:`mortred_twisted.supervisor.scaler`)
        self.scalers: dict[str, Any] = {}

    def all(self) -> list[ManagedServer]:
        return ([self.gateway] if self.gateway else []) + list(self.models.values())

    def model_children(self) -> list[ManagedServer]:
        """Every model process (each replica of a group), in catalog order."""
        out: list[ManagedServer] = []
        for s in self.models.values():
            out.extend(getattr(s, "replicas", [s]))
        return out

    def get(self, server_id: str) -> ManagedServer | None:
        """A child by id: the gateway, a model (or replica group), or one replica
        (``<id>@<n>``)."""
        if self.gateway is not None and server_id == self.gateway.id:
            return self.gateway
        found = self.models.get(server_id)
        if found is None and "@" in server_id:
            group = self.models.get(server_id.rsplit("@", 1)[0])
            member = getattr(group, "member", None)
            found = member(server_id) if member is not None else None
        return found

    def status(self) -> list[dict[str, Any]]:
        docs = [s.status() for s in self.all()]
        for doc in docs:
            scaler = self.scalers.get(doc["id"])
            if scaler is not None:
                doc["autoscale"] = scaler.status()
        return docs

    def start_all(self, autostart: list[str]) -> defer.Deferred[dict[str, bool]]:
        """Start the gateway, then the ``autostart`` models, ``start_concurrency`` at a
        time (each slot is held until that model is ready or has given up)."""
        sem = defer.DeferredSemaphore(self.start_concurrency)
        results: dict[str, bool] = {}
        if self.gateway is not None:
            self.gateway.start().addCallback(lambda ok: results.__setitem__("gateway", ok))

        def start_unless_closing(server: ManagedServer) -> defer.Deferred[bool]:
            # A slot can free up after shutdown began: never spawn into a stopping plane.
            return defer.succeed(False) if self.closing else server.start()

        def one(server: ManagedServer) -> defer.Deferred[None]:
            d = sem.run(start_unless_closing, server)
            d.addCallback(lambda ok: results.__setitem__(server.id, ok))
            return d

        ds = [one(self.models[i]) for i in autostart if i in self.models]
        gathered = defer.gatherResults(ds, consumeErrors=True)
        gathered.addCallback(lambda _: results)
        return gathered

    def stop_all(self) -> defer.Deferred[None]:
        """Stop every model (in parallel), then the gateway; no autostart after this."""
        self.closing = True
        for scaler in self.scalers.values():
            scaler.stop()
        ds = [s.stop() for s in self.models.values()]
        d = defer.gatherResults(ds, consumeErrors=True)
        if self.gateway is not None:
            gateway = self.gateway
            d.addBoth(lambda _: gateway.stop())
        d.addBoth(lambda _: None)
        return d
