"""Twisted plumbing of the Twisted client: failures as ``OSError`` s, a response body
as a queue of chunks, headers as a dict. Reactor thread only."""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet import defer, error
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web import client as web_client
from twisted.web.http import PotentialDataLoss

#: Twisted's ways of saying "no complete answer" (mapped to ``OSError`` s, which the
#: retry policy classifies like the sync client's).
_TRANSPORT_FAILURES: tuple[type[BaseException], ...] = (
    error.ConnectError,
    error.ConnectionLost,
    error.ConnectionDone,
    error.TimeoutError,
    defer.CancelledError,
    web_client.ResponseFailed,
    web_client.ResponseNeverReceived,
    web_client.RequestTransmissionFailed,
    web_client.RequestNotSent,  # type: ignore[attr-defined]
)


def as_os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` a Twisted transport failure stands for, or ``None`` (a bug,
    not a transport failure: re-raise it)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, error.ConnectionRefusedError):
        return ConnectionRefusedError(str(exc))
    if isinstance(exc, error.TimeoutError | defer.CancelledError):
        return TimeoutError(str(exc) or "timed out")
    if isinstance(exc, _TRANSPORT_FAILURES):
        reasons = getattr(exc, "reasons", None)
        detail = "; ".join(r.getErrorMessage() for r in reasons) if reasons else str(exc)
        return ConnectionError(f"{type(exc).__name__}: {detail}")
    return None


class BodyChunks(Protocol):
    """A response body as a queue of chunks: :meth:`next` fires with the next chunk,
    ``None`` at its clean end, or fails with ``ConnectionError``."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._waiting: defer.Deferred[bytes | None] | None = None
        self._end: Failure | None = None
        self._ended = False

    def dataReceived(self, data: bytes) -> None:
        self._chunks.append(data)
        self._wake()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._ended = True
        if not reason.check(web_client.ResponseDone, PotentialDataLoss):
            self._end = reason
        self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.callback(None)

    async def next(self) -> bytes | None:
        while not self._chunks and not self._ended:
            self._waiting = defer.Deferred()
            await self._waiting
        if self._chunks:
            return self._chunks.popleft()
        if self._end is not None:
            exc = self._end.value
            raise ConnectionError(f"{type(exc).__name__}: {exc}")
        return None

    def abort(self) -> None:
        """Stop reading: abort the connection unless the body already ended."""
        if not self._ended and self.transport is not None:
            self.transport.stopProducing()


def response_headers(response: Any) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): b", ".join(values).decode("latin-1")
        for name, values in response.headers.getAllRawHeaders()
    }
