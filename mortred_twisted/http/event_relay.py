"""Relay an upstream ``text/event-stream`` to a twisted.web request as it arrives.

The supervisor's UI follows a job's live events through this relay: each chunk the
model server writes is written to the browser's request at once (nothing is
buffered until the job ends), and a browser that disconnects stops the upstream
body (``IPushProducer.stopProducing`` on the body's transport, which closes that
connection), so the model server's stream ends too. Public Twisted APIs only:
``IAgent.request``, ``IResponse.deliverBody``, ``IRequest.write``.

Contract of :func:`relay_events`: awaited from a Klein route (whose Deferred Klein
cancels when the client goes away). Sets the status and the passed-through headers;
for a 200 ``text/event-stream`` answer writes every chunk as it comes (up to its last
complete line, so that ``rewrite_data`` sees whole ``data:`` lines; the model writes
whole records) and returns
``b""`` when the upstream stream ends (for any reason: the job is terminal, or the
model went away; a browser then reconnects); for any other answer returns its body
whole. Raises :class:`~mortred_twisted.http11.upstream.UpstreamUnavailable` (the
model is not listening) or :class:`~.UpstreamTransportError` before anything was
written. Reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer, error
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.client import readBody
from twisted.web.http_headers import Headers

from mortred_twisted.http11.upstream import UpstreamTransportError, UpstreamUnavailable

PASSED_HEADERS = (b"content-type", b"cache-control", b"x-request-id", b"retry-after")


class _Relay(Protocol):
    """Writes each body chunk's complete lines to ``request`` (``data:`` lines through
    ``rewrite_data``); ``done`` fires when the body ends."""

    def __init__(
        self,
        request: Any,
        done: defer.Deferred[None],
        rewrite_data: Callable[[bytes], bytes] | None,
    ) -> None:
        self.request = request
        self.done = done
        self.rewrite_data = rewrite_data
        self.partial = b""
        self.client_gone = False
        request.notifyFinish().addErrback(self._client_left)

    def _client_left(self, _failure: Failure) -> None:
        self.client_gone = True

    def dataReceived(self, data: bytes) -> None:
        if self.client_gone:
            return
        data = self.partial + data
        end = data.rfind(b"\n") + 1
        self.partial = data[end:]
        if end:
            self.request.write(self._rewrite(data[:end]))

    def _rewrite(self, lines: bytes) -> bytes:
        if self.rewrite_data is None or b"data:" not in lines:
            return lines
        out = []
        for line in lines.splitlines(keepends=True):
            if line.startswith(b"data:"):
                body = line.rstrip(b"\r\n")
                line = self.rewrite_data(body) + line[len(body) :]
            out.append(line)
        return b"".join(out)

    def connectionLost(self, reason: Failure | None = None) -> None:
        # ResponseDone (the job ended), PotentialDataLoss or ResponseFailed (the
        # model went away): the stream is over either way.
        if self.partial and not self.client_gone:
            self.request.write(self.partial)
        self.partial = b""
        if not self.done.called:
            self.done.callback(None)

    def abort(self) -> None:
        """Stop the upstream body: closes the connection to the model."""
        if self.transport is not None:
            self.transport.stopProducing()


async def relay_events(
    agent: Any,
    request: Any,
    url: str,
    headers: Headers,
    rewrite_data: Callable[[bytes], bytes] | None = None,
) -> bytes:
    """See the module docstring. ``rewrite_data`` maps one ``data:`` line (without its
    line ending) to its replacement, which must be one line."""
    try:
        response = await agent.request(b"GET", url.encode("ascii"), headers, None)
    except defer.CancelledError:
        raise
    except error.ConnectError as exc:  # refused, unreachable, connect timeout
        raise UpstreamUnavailable(f"model not running ({exc})") from None
    except Exception as exc:
        raise UpstreamTransportError(f"upstream transport failure: {exc}") from None
    request.setResponseCode(response.code)
    for name in PASSED_HEADERS:
        values = response.headers.getRawHeaders(name)
        if values:
            request.responseHeaders.setRawHeaders(name, values)
    ctype = (response.headers.getRawHeaders(b"content-type") or [b""])[0]
    if response.code != 200 or not ctype.startswith(b"text/event-stream"):
        body: bytes = await readBody(response)
        return body
    request.setHeader(b"X-Accel-Buffering", b"no")
    done: defer.Deferred[None] = defer.Deferred()
    relay = _Relay(request, done, rewrite_data)
    response.deliverBody(relay)
    try:
        await done
    except defer.CancelledError:
        relay.abort()  # the client went away: release the model's stream
        raise
    return b""
