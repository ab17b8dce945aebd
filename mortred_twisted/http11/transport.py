"""Writing to a plain TCP transport without a reactor round (edge, reactor thread).

Shared by the gateway's two sides (the client-facing server and the upstream pool),
which both send each message in one write. Public Twisted API only: the socket from
``ITCPTransport.getHandle()``, and ``connected`` / ``disconnecting`` / ``producer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import tcp

#: Transports whose socket :class:`EagerWriter` may use directly (not TLS, not tests').
_PLAIN_TCP = (tcp.Client, tcp.Server)


class EagerWriter:
    """``transport.write``, but sent on the socket at once while nothing is queued.

    Saves the writer registration (two ``epoll_ctl``) and a reactor round before the
    bytes leave. The writer must be the only one writing to ``transport``: whatever
    the socket does not take at once (and any error) goes through
    ``transport.write``, and from then on every write does, so bytes never overtake
    the ones Twisted holds (Twisted reports a send error as a lost connection).
    """

    __slots__ = ("_on_backlog", "_socket", "_transport", "queued")

    def __init__(self, transport: Any, on_backlog: Callable[[], None] | None = None) -> None:
        self._transport = transport
        self._socket = transport.getHandle() if type(transport) in _PLAIN_TCP else None
        #: called once, when Twisted first holds bytes of ours (write flow control);
        #: at once for a transport whose socket is not used directly
        self._on_backlog = on_backlog
        #: bytes handed to ``transport.write`` (held by Twisted until the socket
        #: takes them): with the transport's own count of what it still holds, how
        #: much of it the client has taken (the write deadline's progress)
        self.queued = 0
        if self._socket is None and on_backlog is not None:
            self._on_backlog = None
            on_backlog()

    def through_transport(self) -> None:
        """From now on every write goes through ``transport.write`` (another writer,
        a producer, writes to the transport too: bytes must never overtake)."""
        self._socket = None

    def write(self, data: bytes) -> None:
        transport = self._transport
        sock = self._socket
        if (
            sock is not None
            and transport.connected
            and not transport.disconnecting
            and transport.producer is None
        ):
            try:
                sent = sock.send(data)
            except OSError:
                sent = 0
            if sent == len(data):
                return
            self._socket = None  # Twisted holds bytes now: it writes all the rest
            data = data[sent:]
            if self._on_backlog is not None:
                on_backlog, self._on_backlog = self._on_backlog, None
                on_backlog()
        self.queued += len(data)
        transport.write(data)
