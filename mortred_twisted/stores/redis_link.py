"""``RedisLink``: one process's connections to Redis, on the reactor
(:class:`~mortred_twisted.stores.resp.RespConnection`, RESP through hiredis).

Two connections, each kept up by a :class:`_Keeper` (reconnect with backoff), to a
host name, an IPv4 or an IPv6 address (``HostnameEndpoint``), over TLS for
``rediss://`` (verified against ``ca_file`` or the system's trust store, with a
client certificate when given):

- **commands**: every store operation is one ``EVALSHA`` of a script from
  :mod:`mortred_twisted.stores.redis_scripts` (loaded on each new connection, after
  ``AUTH``/``SELECT``, so a restarted Redis gets them again; ``on_connected`` runs
  after each). Replies are hiredis' values (bytes, ints, lists; never decoded or
  number-converted). While the connection is down a call fails at once with
  :class:`StoreUnavailable` — it is never queued to run later, so a refused submit
  leaves nothing behind.
- **events**: a ``SUBSCRIBE`` to the model's channel; each message is handed to
  ``on_event``. After every (re)subscription ``on_subscribed`` runs, so the owner
  can re-read whatever it waits for: an event published while the subscription
  was down is never lost, only noticed late.

**Silent connections.** A connection that stops answering (Redis hung, a NAT or
firewall that dropped the flow, a failover: the socket stays open, nothing comes
back) is found by one watchdog: every ``timeout_s / 10`` it looks at each
connection's oldest unanswered command (replies come in order) and sends a ``PING``
on each connection whose last one was ``timeout_s / 4`` ago (subscribed mode allows
``PING``). A command or ``PING`` unanswered for ``timeout_s`` aborts the connection;
its keeper connects a new one, which logs in, loads scripts or resubscribes
and runs ``on_connected``/``on_subscribed``. Worst case from the moment a link goes
silent to the abort: ``timeout_s / 4 + timeout_s + 2 × timeout_s / 10`` (4.35 s at
the default 3 s). The sockets also get TCP keepalive.

**Metrics** (when a ``registry`` is given): ``mortred_redis_reconnects_total
{connection}`` (connections made after the first, per connection) and
``mortred_redis_round_trip_ms{connection}`` (each ``PING``'s round trip: queueing
behind other commands included, as a command would see it).

**Failures to connect** are logged with their reason (a refused ``AUTH``, a
certificate that does not verify), once per distinct reason and again every
``REPEAT_LOG_S``; the owner stays not ready meanwhile (:meth:`when_connected`).

Nothing here ever blocks the reactor thread. Thread contract: reactor thread only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.config.server import RedisAddress
from mortred_twisted.jobs.store import StoreUnavailable
from mortred_twisted.stores.redis_scripts import GROUP, SCRIPTS
from mortred_twisted.stores.resp import RedisReplyError, RespConnection

log = Logger()

REPEAT_LOG_S = 30.0
CONNECT_TIMEOUT_S = 5
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


class RedisLinkMetrics:
    """The Redis link's metric families, on the process's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reconnects = Counter(
            "mortred_redis_reconnects_total",
            "Redis connections made after the first one, per connection (commands, events)",
            ["connection"],
            registry=registry,
        )
        self.round_trip = Histogram(
            "mortred_redis_round_trip_ms",
            "Round trip of the link's PING to Redis, per connection (ms)",
            ["connection"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000, 5000),
            registry=registry,
        )


def redis_endpoint(reactor: Any, address: RedisAddress) -> Any:
    """A client endpoint for ``address``: TCP to a name or an IPv4/IPv6 address, inside
    TLS for ``rediss://`` (verified: the certificate must chain to ``ca_file`` — or
    the system's trust store — and name ``address.host``). ValueError or OSError for
    unreadable certificate files."""
    tcp = HostnameEndpoint(reactor, address.host, address.port, timeout=CONNECT_TIMEOUT_S)
    if not address.tls:
        return tcp
    from twisted.internet import ssl

    trust: Any = None
    if address.ca_file:
        pems = _PEM_CERT.findall(Path(address.ca_file).read_bytes())
        if not pems:
            raise ValueError(f"redis_ca_file: no PEM certificate in {address.ca_file}")
        trust = ssl.trustRootFromCertificates([ssl.Certificate.loadPEM(p) for p in pems])
    client = None
    if address.cert_file:
        pem = Path(address.cert_file).read_bytes() + b"\n" + Path(address.key_file).read_bytes()
        client = ssl.PrivateCertificate.loadPEM(pem)
    options = ssl.optionsForClientTLS(address.host, trustRoot=trust, clientCertificate=client)
    return wrapClientTLS(options, tcp)


class _Factory(Factory):
    """Builds :class:`RespConnection` protocols for one Redis address."""

    noisy = False

    def __init__(
        self,
        reactor: Any,
        address: RedisAddress,
        on_message: Callable[[bytes], None] | None,
        keepalive_s: float,
    ) -> None:
        self._reactor = reactor
        self._address = address
        self._on_message = on_message
        self._keepalive_s = keepalive_s

    def buildProtocol(self, addr: Any) -> RespConnection:
        proto = RespConnection(
            self._reactor,
            label=self._address.redacted(),
            on_message=self._on_message,
            keepalive_s=self._keepalive_s,
        )
        proto.factory = self
        return proto


class _Keeper:
    """Keeps one connection up: connect, ``prepare`` it (log in, load, subscribe),
    and after any failure or loss connect again, after 0.1 s doubling to 2 s while
    attempts keep failing. (Twisted's ``ClientService`` leaves a connection whose
    preparation failed open, and raises from its state machine when one closes
    while it waits to retry.)"""

    def __init__(
        self,
        reactor: Any,
        endpoint: Any,
        factory: Factory,
        prepare: Callable[[RespConnection], Deferred[None]],
    ) -> None:
        self._reactor = reactor
        self._endpoint = endpoint
        self._factory = factory
        self._prepare = prepare
        self._running = False
        self._failures = 0
        self._timer: Any = None
        self._connecting: Deferred[Any] | None = None
        self._proto: RespConnection | None = None

    def start(self) -> None:
        self._running = True
        self._attempt()

    def stop(self) -> Deferred[Any]:
        self._running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        proto = self._proto
        if proto is None or not proto.connected:
            return succeed(None)
        proto.transport.loseConnection()
        return proto.lost

    def _attempt(self) -> None:
        self._timer = None
        if not self._running:
            return
        connecting = self._endpoint.connect(self._factory)
        self._connecting = connecting
        connecting.addCallbacks(self._connected, self._cannot_connect)

    def _cannot_connect(self, _failure: Failure) -> None:
        self._connecting = None
        self._failures += 1
        self._again()

    def _connected(self, proto: RespConnection) -> None:
        self._connecting = None
        self._proto = proto
        proto.lost.addCallback(self._gone)
        if not self._running:
            proto.transport.loseConnection()
            return

        def ready(_: Any) -> None:
            self._failures = 0

        def failed(_f: Failure) -> None:
            self._failures += 1
            if proto.connected:
                proto.transport.abortConnection()  # lost -> the next attempt

        self._prepare(proto).addCallbacks(ready, failed)

    def _gone(self, proto: RespConnection) -> RespConnection:
        self._again()
        return proto  # the link's own callbacks on ``lost`` get the protocol too

    def _again(self) -> None:
        if not self._running or self._timer is not None:
            return
        delay = min(2.0, 0.1 * 2 ** max(0, self._failures - 1))
        self._timer = self._reactor.callLater(delay, self._attempt)


class _Watched:
    """One connection's health: the protocol while it is up, its outstanding PING."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proto: RespConnection | None = None
        self.ping_sent: float | None = None  # the PING in flight, when it was sent
        self.last_ping = 0.0
        self.connections = 0

    def up(self, proto: RespConnection, now: float, metrics: RedisLinkMetrics | None) -> None:
        self.proto, self.ping_sent, self.last_ping = proto, None, now
        self.connections += 1
        if self.connections > 1 and metrics is not None:
            metrics.reconnects.labels(connection=self.name).inc()


class RedisLink:
    """Command and event connections to one Redis (see the module docstring)."""

    def __init__(
        self,
        reactor: Any,
        address: RedisAddress,
        *,
        channel: str,
        stream: str,
        on_event: Callable[[bytes], None],
        on_subscribed: Callable[[], None],
        on_connected: Callable[[], None] | None = None,
        reply_timeout_s: float = 3.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.address = address
        self._reactor = reactor
        self._channel = channel
        self._stream = stream
        self._on_subscribed = on_subscribed
        self._on_connected = on_connected
        self._shas: dict[str, str] = {}
        self._conn: RespConnection | None = None
        self._sub: RespConnection | None = None
        self._metrics = RedisLinkMetrics(registry) if registry is not None else None
        self._watched = {name: _Watched(name) for name in ("commands", "events")}
        self._last_problem: tuple[str, float] = ("", float("-inf"))
        endpoint = redis_endpoint(reactor, address)
        self._reply_timeout_s = reply_timeout_s
        keepalive_s = max(1.0, reply_timeout_s / 2)
        cmd_factory = _Factory(reactor, address, None, keepalive_s)
        self._commands = _Keeper(reactor, endpoint, cmd_factory, self._prepare)
        sub_factory = _Factory(reactor, address, on_event, keepalive_s)
        self._events = _Keeper(reactor, endpoint, sub_factory, self._subscribe)
        self._ready: list[Deferred[None]] = []
        self._watchdog = LoopingCall(self._check_health)
        self._watchdog.clock = reactor

    @property
    def connected(self) -> bool:
        return self._conn is not None and bool(self._conn.connected)

    @property
    def subscribed(self) -> bool:
        return self._sub is not None and bool(self._sub.connected)

    def start(self) -> None:
        self._commands.start()
        self._events.start()
        self._watchdog.start(self._reply_timeout_s / 10, now=False)

    def stop(self) -> Deferred[Any]:
        self._conn = self._sub = None
        if self._watchdog.running:
            self._watchdog.stop()
        return gatherResults([self._commands.stop(), self._events.stop()], consumeErrors=True)

    def when_connected(self) -> Deferred[None]:
        """Fires once the command connection is up with its scripts loaded."""
        d: Deferred[None] = Deferred()
        if self.connected:
            d.callback(None)
        else:
            self._ready.append(d)
        return d

    # -- connecting -----------------------------------------------------------------

    async def _login(self, proto: RespConnection) -> None:
        """``AUTH`` and ``SELECT`` as the URL asks (a refusal drops the connection)."""
        a = self.address
        try:
            if a.password is not None:
                await proto.call("AUTH", *([a.username] if a.username else []), a.password)
            if a.db:
                await proto.call("SELECT", a.db)
        except RedisReplyError as exc:
            # The reply names the refusal (WRONGPASS, NOAUTH, DB index); never the secret.
            log.error("redis refused AUTH/SELECT ({why}); check redis_url {url}",
                      why=str(exc).split(" ", 1)[0], url=a.redacted())  # fmt: skip
            proto.transport.loseConnection()
            raise

    async def _prepare_async(self, proto: RespConnection) -> None:
        await self._login(proto)
        for name, text in SCRIPTS.items():
            sha = await proto.call("SCRIPT", "LOAD", text)
            self._shas[name] = sha.decode()
        try:
            await proto.call("XGROUP", "CREATE", self._stream, GROUP, "0", "MKSTREAM")
        except RedisReplyError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._conn = proto
        self._watched["commands"].up(proto, self._reactor.seconds(), self._metrics)
        log.info("job store connected to {url}", url=self.address.redacted())
        proto.lost.addCallback(self._lost)
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(None)
        if self._on_connected is not None:
            self._on_connected()

    def _prepare(self, proto: RespConnection) -> Deferred[None]:
        d = Deferred.fromCoroutine(self._prepare_async(proto))
        # A link that goes silent while logging in is not watched yet: bound it.
        d.addTimeout(self._reply_timeout_s * 2, self._reactor)
        return d.addErrback(self._cannot_connect, proto)

    def _lost(self, proto: RespConnection) -> None:
        if self._conn is proto:
            self._conn = None
            log.warn("job store connection to {url} lost", url=self.address.redacted())

    async def _subscribe_async(self, proto: RespConnection) -> None:
        await self._login(proto)
        await proto.call("SUBSCRIBE", self._channel)
        self._sub = proto
        self._watched["events"].up(proto, self._reactor.seconds(), self._metrics)
        proto.lost.addCallback(self._sub_lost)
        self._on_subscribed()

    def _sub_lost(self, proto: RespConnection) -> None:
        if self._sub is proto:
            self._sub = None
            log.warn("job store subscription to {url} lost", url=self.address.redacted())

    def _subscribe(self, proto: RespConnection) -> Deferred[None]:
        d = Deferred.fromCoroutine(self._subscribe_async(proto))
        d.addTimeout(self._reply_timeout_s * 2, self._reactor)
        return d.addErrback(self._cannot_connect, proto)

    def _cannot_connect(self, failure: Failure, proto: RespConnection) -> Failure:
        """Log why a new connection could not be used (the TLS handshake's own error
        when there is one), once per reason and every REPEAT_LOG_S; pass it on (the
        keeper drops the connection and tries again)."""
        reason = proto.lost_reason if proto.lost_reason is not None else failure
        why = reason.getErrorMessage()
        if "certificate verify failed" in why or "VerificationError" in repr(reason.value):
            why = (
                f"TLS: the server's certificate does not verify ({why}); check "
                "redis_ca_file and that the certificate names the host of redis_url"
            )
        now = self._reactor.seconds()
        last, at = self._last_problem
        if why != last or now - at >= REPEAT_LOG_S:
            self._last_problem = (why, now)
            log.error("job store: cannot use {url}: {why}", url=self.address.redacted(), why=why)
        return failure

    # -- calls ----------------------------------------------------------------------

    def call(self, *args: Any) -> Deferred[Any]:
        """One Redis command; fails with :class:`StoreUnavailable` when not connected."""
        conn = self._conn
        if conn is None or not conn.connected:
            return fail(StoreUnavailable(f"job store unavailable: not connected to "
                                         f"{self.address.redacted()}"))  # fmt: skip
        return conn.call(*args)

    def script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Deferred[Any]:
        """``EVALSHA`` of a script of :data:`SCRIPTS` (loaded at connect; loaded again
        and retried once if Redis lost it, e.g. after ``SCRIPT FLUSH``)."""
        d = self.call("EVALSHA", self._shas.get(name, ""), len(keys), *keys, *args)

        def reload(failure: Any) -> Any:
            if not (failure.check(RedisReplyError) and "NOSCRIPT" in str(failure.value)):
                return failure
            loaded = self.call("SCRIPT", "LOAD", SCRIPTS[name])

            def again(sha: bytes) -> Deferred[Any]:
                self._shas[name] = sha.decode()
                return self.call("EVALSHA", self._shas[name], len(keys), *keys, *args)

            return loaded.addCallback(again)

        return d.addErrback(reload)

    # -- health ---------------------------------------------------------------------

    def _check_health(self) -> None:
        now = self._reactor.seconds()
        for watched in self._watched.values():
            proto = watched.proto
            if proto is None or not proto.connected:
                continue
            waited = proto.oldest_wait()
            if waited > self._reply_timeout_s:
                log.warn(
                    "job store: no reply on the {which} connection to {url} for {s:.1f} s; "
                    "replacing it", which=watched.name, url=self.address.redacted(), s=waited,
                )  # fmt: skip
                watched.proto = None
                proto.transport.abortConnection()
            elif watched.ping_sent is None and now - watched.last_ping >= self._reply_timeout_s / 4:
                self._ping(watched, proto, now)

    def _ping(self, watched: _Watched, proto: RespConnection, now: float) -> None:
        watched.ping_sent = watched.last_ping = now

        def answered(_reply: Any) -> None:
            if watched.proto is proto:
                watched.ping_sent = None
            if self._metrics is not None:
                elapsed_ms = (self._reactor.seconds() - now) * 1000.0
                self._metrics.round_trip.labels(connection=watched.name).observe(elapsed_ms)

        proto.call("PING").addCallbacks(answered, lambda _f: None)
