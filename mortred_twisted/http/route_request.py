"""Klein routes on the project's HTTP server: the request the handlers see, and
werkzeug's matching of the Klein table (used by the model port and the supervisor).

Klein stays the route table (its werkzeug map and ``execute_endpoint``); the
server is :mod:`mortred_twisted.http11.server`, not twisted.web. Handlers see a
:class:`RouteRequest`: the part of ``IRequest`` they use. Thread contract: reactor
thread only.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes

from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.http11.messages import ServerRequest

#: ``(request, failure) -> answer`` for a path no rule matches, or a method its rule
#: does not take (``failure.value.valid_methods``).
ErrorHandler = Callable[[Any, Failure], Any]


class RouteRequest:
    """One request as a route handler sees it (the ``IRequest`` subset routes read
    and write). Handlers may set attributes of their own on it (route label, start
    time, request id)."""

    def __init__(self, proxy: ServerRequest) -> None:
        self._proxy = proxy
        self.method = proxy.method
        self.uri = proxy.uri
        self.path = proxy.path
        self.clientproto = proxy.clientproto
        self.requestHeaders = proxy.requestHeaders
        self.responseHeaders = proxy.responseHeaders
        #: ``getHeader(name)`` / ``setHeader(name, value)``: the server request's own
        #: (bound here: a poll calls them five times, one frame less each)
        self.getHeader: Callable[[bytes], bytes | None] = proxy.getHeader
        self.setHeader: Callable[[bytes, bytes], None] = proxy.setHeader
        self.content = proxy.content if proxy.content is not None else io.BytesIO(b"")
        self.code = 200
        #: what the port decided from the head (``ServerRequest.decided``)
        self.decided = proxy.decided
        self._args: dict[bytes, list[bytes]] | None = None
        #: Deferreds of :meth:`notifyFinish` (None until one is asked for)
        self.finish_waiters: list[Deferred[None]] | None = None

    @property
    def args(self) -> dict[bytes, list[bytes]]:
        """The query's arguments (blank values kept), as twisted.web's ``args``."""
        if self._args is None:
            query = self.uri.partition(b"?")[2]
            self._args = parse_qs(query, keep_blank_values=True) if query else {}
        return self._args

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = self._proxy.code = code

    def getClientAddress(self) -> Any:
        return self._proxy.peer

    def write(self, data: bytes) -> None:
        """The next piece of a streamed answer (the head goes out with the first)."""
        self._proxy.write(data)

    @property
    def started(self) -> bool:
        """A streamed answer's head was sent (an error can no longer be answered)."""
        return bool(self._proxy.started)

    def declare_length(self, length: int | None) -> None:
        """Frame the streamed answer about to be written by ``Content-Length``."""
        self._proxy.declare_length(length)

    def registerProducer(self, producer: Any, streaming: bool = True) -> None:
        """A streamed answer's source, paused while the client does not read."""
        self._proxy.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:
        self._proxy.unregisterProducer()

    def notifyFinish(self) -> Deferred[None]:
        """Fires when the answer is complete; fails if the client went away first."""
        d: Deferred[None] = Deferred()
        if self.finish_waiters is None:
            self.finish_waiters = []
        self.finish_waiters.append(d)
        return d

    def finished(self, outcome: Any) -> None:
        """Called once the route's answer settled (``outcome``: bytes or a Failure)."""
        waiters, self.finish_waiters = self.finish_waiters or [], None
        gone = isinstance(outcome, Failure) and outcome.check(CancelledError)
        for d in waiters:
            if gone:
                d.errback(Failure(ConnectionError("client went away")))
            else:
                d.callback(None)


def settled(request: RouteRequest, outcome: Any) -> Any:
    """``outcome`` (the route's bytes or Deferred), telling ``request`` when it settled."""
    if not isinstance(outcome, Deferred):
        request.finished(outcome)
        return outcome

    def done(result: Any) -> Any:
        request.finished(result)
        return result

    return outcome.addBoth(done)


def route_with_klein(
    klein: Any,
    request: RouteRequest,
    *,
    not_found: ErrorHandler,
    method_not_allowed: ErrorHandler,
) -> Any:
    """Match ``request`` in the Klein app's werkzeug map and run the endpoint Klein
    would run; a path that is not UTF-8 is a 400 as in Klein."""
    try:
        path_info = unquote_to_bytes(request.path).decode("utf-8")
    except UnicodeDecodeError:
        request.setResponseCode(400)
        request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
        return b"Non-UTF-8 encoding in URL."
    mapper = klein.url_map.bind(
        "localhost", path_info=path_info, default_method=request.method.decode("latin-1")
    )
    try:
        rule, kwargs = mapper.match(return_rule=True)
    except MethodNotAllowed as exc:
        return method_not_allowed(request, Failure(exc))
    except NotFound as exc:
        return not_found(request, Failure(exc))
    return klein.execute_endpoint(rule.endpoint, request, **kwargs)


def match_endpoint(klein: Any, method: bytes, path: bytes) -> str | Exception:
    """The endpoint name Klein's map gives ``method path``, or the werkzeug error
    (``NotFound``, ``MethodNotAllowed`` with ``valid_methods``): for decisions
    made from a request's head."""
    try:
        path_info = unquote_to_bytes(path.split(b"?", 1)[0]).decode("utf-8")
    except UnicodeDecodeError:
        return NotFound()
    mapper = klein.url_map.bind(
        "localhost", path_info=path_info, default_method=method.decode("latin-1")
    )
    try:
        endpoint, _kwargs = mapper.match()
    except (MethodNotAllowed, NotFound) as exc:
        return exc
    return str(endpoint)
