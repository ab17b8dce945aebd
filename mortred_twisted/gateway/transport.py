"""Writing to a plain TCP transport without a reactor round (edge, reactor thread).

Shared by the gateway's two sides (the client-facing server and the upstream pool),
which both send each message in one write.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp

#: Transports whose socket :func:`eager_write` may use directly (not TLS, not tests').
_PLAIN_TCP = (tcp.Client, tcp.Server)


def eager_write(transport: Any, data: bytes) -> None:
    """``transport.write(data)``, but sent on the socket now when the transport is a
    plain idle TCP connection: saves the writer registration (two ``epoll_ctl``) and a
    reactor round before the bytes leave. Whatever the socket does not take at once,
    and any error, goes through ``transport.write`` (Twisted then reports the error as
    a lost connection)."""
    if (
        type(transport) in _PLAIN_TCP
        and transport.connected
        and not transport.disconnecting
        and not transport.dataBuffer
        and not transport._tempDataBuffer
        and transport.producer is None
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)
