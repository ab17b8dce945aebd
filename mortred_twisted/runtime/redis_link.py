"""``RedisLink``: one process's connections to Redis, on the reactor
(:class:`~mortred_twisted.runtime.resp.RespConnection`, RESP through hiredis).

Two connections, each kept up by a ``ClientService`` (reconnect with backoff):

- **commands**: every store operation is one ``EVALSHA`` of a script from
  :mod:`mortred_twisted.jobs.redis_scripts` (loaded on each new connection, after
  ``AUTH``/``SELECT``, so a restarted Redis gets them again; ``on_connected`` runs
  after each). Replies are hiredis' values (bytes, ints, lists; never decoded or
  number-converted). While the connection is down a call fails at once with
  :class:`StoreUnavailable` — it is never queued to run later, so a refused submit
  leaves nothing behind. A reply that takes longer than ``reply_timeout_s`` drops
  the connection (and the call fails): one watchdog a second looks at the oldest
  unanswered command (replies come in order), instead of a timer per command.
- **events**: a ``SUBSCRIBE`` to the model's channel; each message is handed to
  ``on_event``. After every (re)subscription ``on_subscribed`` runs, so the owner
  can re-read whatever it waits for: an event published while the subscription
  was down is never lost, only noticed late.

Nothing here ever blocks the reactor thread. Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mortred_twisted.config.server import RedisAddress
from mortred_twisted.jobs.redis_scripts import GROUP, SCRIPTS
from mortred_twisted.jobs.store import StoreUnavailable
from mortred_twisted.runtime.resp import RedisReplyError, RespConnection

log = Logger()


class _Factory(Factory):
    """Builds :class:`RespConnection` protocols for one Redis address."""

    noisy = False

    def __init__(
        self, reactor: Any, address: RedisAddress, on_message: Callable[[bytes], None] | None
    ) -> None:
        self._reactor = reactor
        self._address = address
        self._on_message = on_message

    def buildProtocol(self, addr: Any) -> RespConnection:
        proto = RespConnection(
            self._reactor, label=self._address.redacted(), on_message=self._on_message
        )
        proto.factory = self
        return proto


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
        reply_timeout_s: float = 5.0,
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
        endpoint = TCP4ClientEndpoint(reactor, address.host, address.port, timeout=5)
        policy = backoffPolicy(initialDelay=0.1, maxDelay=2.0, factor=2.0)
        self._reply_timeout_s = reply_timeout_s
        cmd_factory = _Factory(reactor, address, None)
        self._commands = ClientService(
            endpoint, cmd_factory, retryPolicy=policy, prepareConnection=self._prepare,
            clock=reactor,
        )  # fmt: skip
        sub_factory = _Factory(reactor, address, on_event)
        self._events = ClientService(
            endpoint, sub_factory, retryPolicy=policy, prepareConnection=self._subscribe,
            clock=reactor,
        )  # fmt: skip
        self._ready: list[Deferred[None]] = []
        self._watchdog = LoopingCall(self._check_replies)
        self._watchdog.clock = reactor

    @property
    def connected(self) -> bool:
        return self._conn is not None and bool(self._conn.connected)

    def start(self) -> None:
        self._commands.startService()
        self._events.startService()
        self._watchdog.start(1.0, now=False)

    def stop(self) -> Deferred[Any]:
        self._conn = None
        if self._watchdog.running:
            self._watchdog.stop()
        return gatherResults(
            [self._commands.stopService(), self._events.stopService()], consumeErrors=True
        )

    def when_connected(self) -> Deferred[None]:
        """Fires once the command connection is up with its scripts loaded."""
        d: Deferred[None] = Deferred()
        if self.connected:
            d.callback(None)
        else:
            self._ready.append(d)
        return d

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
        log.info("job store connected to {url}", url=self.address.redacted())
        proto.lost.addCallback(self._lost)
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(None)
        if self._on_connected is not None:
            self._on_connected()

    def _prepare(self, proto: RespConnection) -> Deferred[None]:
        return Deferred.fromCoroutine(self._prepare_async(proto))

    def _lost(self, proto: RespConnection) -> None:
        if self._conn is proto:
            self._conn = None
            log.warn("job store connection to {url} lost", url=self.address.redacted())

    async def _subscribe_async(self, proto: RespConnection) -> None:
        await self._login(proto)
        await proto.call("SUBSCRIBE", self._channel)
        self._sub = proto
        self._on_subscribed()

    def _subscribe(self, proto: RespConnection) -> Deferred[None]:
        return Deferred.fromCoroutine(self._subscribe_async(proto))

    def call(self, *args: Any) -> Deferred[Any]:
        """One Redis command; fails with :class:`StoreUnavailable` when not connected."""
        conn = self._conn
        if conn is None or not conn.connected:
            return fail(StoreUnavailable(f"job store unavailable: not connected to "
                                         f"{self.address.redacted()}"))  # fmt: skip
        return conn.call(*args)

    def _check_replies(self) -> None:
        conn = self._conn
        if conn is None:
            return
        waited = conn.oldest_wait()
        if waited > self._reply_timeout_s:
            log.warn("job store: no reply from {url} for {s:.1f} s; reconnecting",
                     url=self.address.redacted(), s=waited)  # fmt: skip
            conn.transport.abortConnection()

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
