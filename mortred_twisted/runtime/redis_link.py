"""``RedisLink``: one process's connections to Redis, on the reactor (txredisapi).

Two connections, each kept up by a ``ClientService`` (reconnect with backoff):

- **commands**: every store operation is one ``EVALSHA`` of a script from
  :mod:`mortred_twisted.jobs.redis_scripts` (loaded on each new connection, so a
  restarted Redis gets them again; ``on_connected`` runs after each). Replies are
  bytes (``charset=None``) and never number-converted. While the connection is
  down a call fails at once with :class:`StoreUnavailable` — it is never queued
  to run later, so a refused submit leaves nothing behind. A reply that takes
  longer than ``reply_timeout_s`` drops the connection (and the call fails): one
  watchdog a second looks at the oldest unanswered command (replies come in order),
  instead of a timer per command.
- **events**: a ``SUBSCRIBE`` to the model's channel; each message is handed to
  ``on_event``. After every (re)subscription ``on_subscribed`` runs, so the owner
  can re-read whatever it waits for: an event published while the subscription
  was down is never lost, only noticed late.

Nothing here ever blocks the reactor thread. Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import txredisapi
from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mortred_twisted.config.server import RedisAddress
from mortred_twisted.jobs.redis_scripts import GROUP, SCRIPTS
from mortred_twisted.jobs.store import StoreUnavailable

log = Logger()


class _Factory(Factory):
    """Builds txredisapi protocols; the hooks txredisapi's protocol calls back."""

    isLazy = True
    noisy = False

    def __init__(self, protocol_class: type, address: RedisAddress, reply_timeout_s: float):
        self._protocol_class = protocol_class
        self._address = address
        self._timeout = reply_timeout_s
        self.on_message: Callable[[bytes], None] | None = None

    def buildProtocol(self, addr: Any) -> Any:
        a = self._address
        proto = self._protocol_class(
            charset=None, replyTimeout=self._timeout, password=a.password,
            dbid=a.db or None, convertNumbers=False, username=a.username,
        )  # fmt: skip
        proto.factory = self
        if self.on_message is not None:
            proto.messageReceived = lambda _pattern, _channel, message: self.on_message(message)
        return proto

    def stopTrying(self) -> None:  # called by txredisapi when AUTH/SELECT fail
        log.error("redis refused AUTH/SELECT; check redis_url")

    def connectionError(self, why: str) -> None:
        log.error("{why}", why=why)


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
        self._conn: Any = None
        self._sub: Any = None
        endpoint = TCP4ClientEndpoint(reactor, address.host, address.port, timeout=5)
        policy = backoffPolicy(initialDelay=0.1, maxDelay=2.0, factor=2.0)
        self._reply_timeout_s = reply_timeout_s
        cmd_factory = _Factory(txredisapi.RedisProtocol, address, 0)
        self._commands = ClientService(
            endpoint, cmd_factory, retryPolicy=policy, prepareConnection=self._prepare,
            clock=reactor,
        )  # fmt: skip
        sub_factory = _Factory(txredisapi.SubscriberProtocol, address, 0)
        sub_factory.on_message = on_event
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

    async def _prepare_async(self, proto: Any) -> None:
        await proto.whenConnected()
        for name, text in SCRIPTS.items():
            sha = await proto.execute_command("SCRIPT", "LOAD", text)
            self._shas[name] = sha.decode() if isinstance(sha, bytes) else sha
        try:
            await proto.execute_command("XGROUP", "CREATE", self._stream, GROUP, "0", "MKSTREAM")
        except txredisapi.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        proto.mortred_sent = deque()  # send times of unanswered commands, in order
        self._conn = proto
        log.info("job store connected to {url}", url=self.address.redacted())
        proto.whenDisconnected().addCallback(self._lost)
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(None)
        if self._on_connected is not None:
            self._on_connected()

    def _prepare(self, proto: Any) -> Deferred[None]:
        return Deferred.fromCoroutine(self._prepare_async(proto))

    def _lost(self, proto: Any) -> None:
        if self._conn is proto:
            self._conn = None
            log.warn("job store connection to {url} lost", url=self.address.redacted())

    async def _subscribe_async(self, proto: Any) -> None:
        await proto.whenConnected()
        await proto.subscribe(self._channel)
        self._sub = proto
        self._on_subscribed()

    def _subscribe(self, proto: Any) -> Deferred[None]:
        return Deferred.fromCoroutine(self._subscribe_async(proto))

    def call(self, *args: Any) -> Deferred[Any]:
        """One Redis command; fails with :class:`StoreUnavailable` when not connected."""
        conn = self._conn
        if conn is None or not conn.connected:
            return fail(StoreUnavailable(f"job store unavailable: not connected to "
                                         f"{self.address.redacted()}"))  # fmt: skip
        try:
            d = conn.execute_command(*args)
        except txredisapi.ConnectionError as exc:
            return fail(StoreUnavailable(f"job store unavailable: {exc}"))
        sent = conn.mortred_sent
        sent.append(self._reactor.seconds())
        d.addBoth(_answered, sent)
        return d.addErrback(_unavailable)

    def _check_replies(self) -> None:
        conn = self._conn
        if conn is None or not conn.mortred_sent:
            return
        waited = self._reactor.seconds() - conn.mortred_sent[0]
        if waited > self._reply_timeout_s:
            log.warn("job store: no reply from {url} for {s:.1f} s; reconnecting",
                     url=self.address.redacted(), s=waited)  # fmt: skip
            conn.transport.abortConnection()

    def script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Deferred[Any]:
        """``EVALSHA`` of a script of :data:`SCRIPTS` (loaded at connect; loaded again
        and retried once if Redis lost it, e.g. after ``SCRIPT FLUSH``)."""
        d = self.call("EVALSHA", self._shas.get(name, ""), len(keys), *keys, *args)

        def reload(failure: Any) -> Any:
            if not (failure.check(txredisapi.ResponseError) and "NOSCRIPT" in str(failure.value)):
                return failure
            loaded = self.call("SCRIPT", "LOAD", SCRIPTS[name])

            def again(sha: Any) -> Deferred[Any]:
                self._shas[name] = sha.decode() if isinstance(sha, bytes) else sha
                return self.call("EVALSHA", self._shas[name], len(keys), *keys, *args)

            return loaded.addCallback(again)

        return d.addErrback(reload)


def _answered(result: Any, sent: deque[float]) -> Any:
    if sent:
        sent.popleft()
    return result


def _unavailable(failure: Any) -> Any:
    if failure.check(txredisapi.ConnectionError) and not failure.check(StoreUnavailable):
        raise StoreUnavailable(f"job store unavailable: {failure.getErrorMessage()}")
    return failure
