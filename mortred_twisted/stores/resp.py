"""``RespConnection``: one Redis connection on the reactor, speaking RESP2 through
hiredis (the C packer and reply reader that redis-py uses).

Commands are written at once and pipelined; Redis answers them in order, so each
reply fires the oldest waiting :class:`~twisted.internet.defer.Deferred`. On a
subscriber connection, pushed ``message`` frames go to ``on_message`` instead.

Why not txredisapi (the client this replaced; measured in docs/benchmarks.md): it
encodes every argument in Python (~28 calls for one ``EVALSHA`` of the admission
script) and fires four to five Deferreds per reply. Here a command is one
``hiredis.pack_command`` call and a reply one ``Deferred.callback``.

Contract (reactor thread only):

- :meth:`call` never waits for a connection: not connected → it fails at once with
  :class:`~mortred_twisted.jobs.store.StoreUnavailable`; nothing is queued to run
  later, so a refused call left nothing in Redis.
- An error reply fails its call with :class:`RedisReplyError` (the connection stays
  up). Bytes that are not RESP abort the connection.
- When the connection ends, every unanswered call fails with ``StoreUnavailable``
  (whether Redis ran it is unknown) and :attr:`lost` fires.
- Replies are hiredis' values untouched: bulk strings as ``bytes``, integers as
  ``int``, nil as ``None``, arrays as lists.
- With ``keepalive_s``, the socket has TCP keepalive (first probe after that many
  idle seconds, then one a second, three unanswered probes end it) and
  ``TCP_USER_TIMEOUT`` (written data unacknowledged that long ends it): a peer that
  vanished is noticed by the kernel even when nothing is asked of it. The link's
  ``PING`` watchdog (:mod:`~mortred_twisted.stores.redis_link`) is the main check;
  these cover a half-open path the pings alone would notice later.
"""

from __future__ import annotations

import contextlib
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
from twisted.internet.defer import Deferred, fail
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from mortred_twisted.jobs.store import StoreUnavailable

__all__ = ["RedisReplyError", "RespConnection"]


class RedisReplyError(Exception):
    """Redis answered a command with an error reply (``-ERR …``, ``-NOSCRIPT …``)."""


class RespConnection(Protocol):
    """See the module docstring. ``on_message(payload)`` receives pub/sub messages."""

    def __init__(
        self,
        clock: Any,
        *,
        label: str = "redis",
        on_message: Callable[[bytes], None] | None = None,
        keepalive_s: float | None = None,
    ) -> None:
        self._clock = clock
        self._label = label
        self._on_message = on_message
        self._keepalive_s = keepalive_s
        #: why the connection ended (None while up, or when it ended cleanly)
        self.lost_reason: Failure | None = None
        self._reader = hiredis.Reader()
        # (Deferred, send time) per unanswered command, oldest first
        self._waiting: deque[tuple[Deferred[Any], float]] = deque()
        self.connected = False
        #: fires (with this protocol) once the connection has ended
        self.lost: Deferred[RespConnection] = Deferred()

    # -- commands -------------------------------------------------------------------

    def call(self, *args: Any) -> Deferred[Any]:
        """Send one command; the Deferred fires with its reply."""
        if not self.connected:
            return fail(StoreUnavailable(f"job store unavailable: not connected to {self._label}"))
        self.transport.write(hiredis.pack_command(args))
        d: Deferred[Any] = Deferred()
        self._waiting.append((d, self._clock.seconds()))
        return d

    def oldest_wait(self) -> float:
        """Seconds the oldest unanswered command has waited (0: none waits)."""
        if not self._waiting:
            return 0.0
        return self._clock.seconds() - self._waiting[0][1]

    # -- Protocol -------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.connected = True
        # Pipelined small commands: Nagle would hold one back until the previous
        # one is acknowledged.
        no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if no_delay is not None:
            no_delay(True)
        if self._keepalive_s is not None:
            # A TLS transport forwards attribute lookups to the TCP one beneath.
            sock = getattr(self.transport, "socket", None)
            if isinstance(sock, socket.socket):
                _keepalive(sock, self._keepalive_s)

    def dataReceived(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError:
                self.transport.abortConnection()
                return
            if reply is False:
                return
            if (
                self._on_message is not None
                and type(reply) is list
                and len(reply) == 3
                and reply[0] == b"message"
            ):
                self._on_message(reply[2])
                continue
            if not self._waiting:  # a reply nobody asked for: the stream is lost
                self.transport.abortConnection()
                return
            d, _sent = self._waiting.popleft()
            if isinstance(reply, hiredis.ReplyError):
                d.errback(Failure(RedisReplyError(str(reply))))
            else:
                d.callback(reply)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.connected = False
        self.lost_reason = reason
        waiting, self._waiting = self._waiting, deque()
        why = "connection lost" if reason is None else reason.getErrorMessage()
        for d, _sent in waiting:
            d.errback(Failure(StoreUnavailable(f"job store unavailable: {self._label}: {why}")))
        self.lost.callback(self)


def _keepalive(sock: socket.socket, idle_s: float) -> None:
    """TCP keepalive and user timeout on ``sock`` (Linux names; others: what exists)."""
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), max(1, int(idle_s))),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), int(idle_s * 2000)),
    ]
    for level, name, value in options:
        if name is not None:
            # not on this platform: the PING watchdog still applies
            with contextlib.suppress(OSError):
                sock.setsockopt(level, name, value)
