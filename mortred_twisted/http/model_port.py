"""The model port: the project's HTTP/1.1 server serving the model's routes.

A model port is served by :class:`~mortred_twisted.http11.server.HTTPServerFactory`'s
connections (llhttp framing and the RFC rules of
:func:`~mortred_twisted.http11.messages.check_head`, pipelining answered in order,
decisions from the head, the body budget, write flow control, read and idle
deadlines by one sweep, a connection cap, streamed answers and cancel-on-disconnect),
the same server as the gateway's and the supervisor's.

The routes and handlers are the model server's own (:class:`ModelServerApp`), declared
once in its Klein app:

* the hot routes (submit, status, wait, result, sync infer) are matched by hand with
  :class:`~mortred_twisted.http.hot_routes.HotRoutes` (the same handlers);
* every other request is matched with the Klein app's own werkzeug map and runs the
  endpoint Klein would run (404 and 405 through the same error handlers; a
  non-UTF-8 path is a 400 as in Klein).

Handlers see a :class:`~mortred_twisted.http.route_request.RouteRequest`: the part
of ``IRequest`` they use. The port's policies: a request with a body is judged from
its head by the app (:meth:`~mortred_twisted.http.request_checks.RequestChecks.
refuse_from_head`: 404 → 405 → 401 → 415 → 413), refusals carry ``X-Request-ID``
(the client's, else a fresh one), every finished request is counted by
``on_finished`` (metrics), and :meth:`ModelPortApp.when_idle` tells a stopping
server when no request is in flight.

Thread contract: reactor thread only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.http.answers import EarlyResponse, refusal_bytes
from mortred_twisted.http.request_checks import RATE_TAKEN
from mortred_twisted.http.route_request import RouteRequest, route_with_klein
from mortred_twisted.http11.auth import is_loopback_host_header
from mortred_twisted.http11.messages import HeaderMap, Refusal, ServerRequest
from mortred_twisted.http11.server import HTTPServerFactory

log = Logger()

#: The ``Server`` header of a model port's answers.
SERVER_HEADER = b"mortred-model"


#: The request the model server's handlers see (kept under its earlier name).
ModelPortRequest = RouteRequest


class ModelPortApp:
    """``dispatch`` for the gateway server: the model server's routes (see the module
    docstring). ``app`` is a :class:`~mortred_twisted.http.model_server.ModelServerApp`."""

    def __init__(self, app: Any, on_finished: Callable[[Any], None] | None = None) -> None:
        self._app = app
        self.model_app = app
        self._hot = app.hot_routes()
        self._open = not app.config.auth_token
        self._klein = app.app  # the Klein app: its werkzeug map and endpoints
        self._on_finished = on_finished
        self._active = 0
        self._idle_waiters: list[Deferred[None]] = []

    # -- in flight ------------------------------------------------------------------

    @property
    def active_requests(self) -> int:
        return self._active

    def when_idle(self) -> Deferred[None]:
        """Fires once no request is being processed (at once if none is)."""
        if not self._active:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._idle_waiters.append(d)
        return d

    def _finished(self, request: ModelPortRequest) -> None:
        self._active -= 1
        if self._on_finished is not None:
            try:
                self._on_finished(request)
            except Exception:
                log.failure("counting a finished request failed")
        if not self._active:
            waiters, self._idle_waiters = self._idle_waiters, []
            for d in waiters:
                d.callback(None)

    # -- dispatch -------------------------------------------------------------------

    def dispatch(self, proxy: ServerRequest) -> bytes | Deferred[bytes]:
        request = ModelPortRequest(proxy)
        self._active += 1
        try:
            outcome = self._route(request)
        except BaseException:
            self._finished(request)
            raise
        if type(outcome) is bytes or not isinstance(outcome, Deferred):  # bytes: no ABC check
            self._finished(request)
            if request.finish_waiters:
                request.finished(outcome)
            return outcome

        def done(result: Any) -> Any:
            if isinstance(result, Failure) and not result.check(CancelledError):
                request.code = 500  # what the server answers (or the stream was cut)
            self._finished(request)
            if request.finish_waiters:
                request.finished(result)
            return result

        return outcome.addBoth(done)

    def _route(self, request: ModelPortRequest) -> bytes | Deferred[bytes]:
        if self._open and not is_loopback_host_header(request.getHeader(b"host")):
            # No token: loopback Host names only (DNS rebinding).
            refused = self._app.checks.host_refused(request.getHeader(b"host"))
            if refused is not None:
                return self._app.responder.job_error(request, refused)
        matched = self._hot.match_path(request.method, request.path)
        if matched is not None:
            handler, kwargs = matched
            return handler(request, **kwargs)
        return route_with_klein(
            self._klein,
            request,
            not_found=self._app.checks.not_found,
            method_not_allowed=self._app.checks.method_not_allowed,
        )


class ModelPortFactory(HTTPServerFactory):
    """The HTTP server's factory with a model port's policies: the model app's answer
    to a head it refuses and to a body over the limit, refusals shaped as the model
    port's (JSON, ``X-Request-ID``), ``Server: mortred-model``, and deadlines swept
    every quarter of the shorter one, at most every second."""

    server_header = SERVER_HEADER
    sweep_fraction = 0.25
    sweep_max_period_s = 1.0

    def __init__(
        self,
        app: ModelPortApp,
        *,
        clock: Any,
        body_limit: int,
        request_id: Callable[[], str],
        max_connections: int = 0,
        read_timeout_s: float = 60.0,
        idle_timeout_s: float = 0.0,
        access_log: bool = False,
        max_connections_per_address: int = 0,
        body_budget_bytes: int = 0,
    ) -> None:
        super().__init__(
            app,
            clock=clock,
            max_body_bytes=body_limit,
            max_connections=max_connections,
            max_connections_per_address=max_connections_per_address,
            body_budget_bytes=body_budget_bytes,
            idle_timeout_s=idle_timeout_s,
            read_timeout_s=read_timeout_s,
            access_log=access_log,
        )
        self.port_app = app
        self._checks = app.model_app.checks
        self._request_id = request_id

    @classmethod
    def for_app(
        cls,
        app: Any,
        clock: Any,
        *,
        on_finished: Callable[[Any], None] | None = None,
        request_id: Callable[[], str] | None = None,
        access_log: bool = False,
    ) -> ModelPortFactory:
        """The port of ``app`` (a :class:`~mortred_twisted.http.model_server.
        ModelServerApp`) with its server config's limits and deadlines. ``peer_resp_
        timeout`` (s; 0 = none) bounds a connection waiting on its client, idle or
        silent mid-request, as Workflow's ``peer_response_timeout``; never while a
        request is being handled (a long wait or run)."""
        cfg = app.config
        from mortred_twisted.http.envelope import new_request_id

        return cls(
            ModelPortApp(app, on_finished=on_finished),
            clock=clock,
            body_limit=cfg.request_size_limit_bytes,
            request_id=request_id or new_request_id,
            max_connections=cfg.max_connections,
            max_connections_per_address=cfg.max_connections_per_client,
            body_budget_bytes=cfg.body_budget_bytes,
            read_timeout_s=cfg.request_read_timeout / 1000.0,
            idle_timeout_s=float(cfg.peer_resp_timeout),
            access_log=access_log,
        )

    def when_idle(self) -> Deferred[None]:
        return self.port_app.when_idle()

    def judge_head(self, request: ServerRequest, length: int) -> Refusal | None:
        """From the head of a request with a body: the model server's own decision
        (404 → 405 → 401 → 415 → 413, :meth:`~mortred_twisted.http.request_checks.
        RequestChecks.refuse_from_head`), then for a POST the per-client rate limit
        (429; its token taken here, not again by the route), shaped as the route
        would answer it."""
        checks = self._checks
        answer = checks.refuse_from_head(
            request.method, request.uri, request.requestHeaders, length
        )
        if answer is None and request.method == b"POST":
            # The per-client rate limit, from the head too: a client over it never
            # has a body of up to request_size_limit read and parsed on the reactor.
            err = checks.rate_limited(request)
            if err is None:
                request.decided = RATE_TAKEN
                return None
            answer = checks.early_response(request.uri, request.requestHeaders, err)
        return None if answer is None else self._refusal(request, answer)

    def too_large(self, request: ServerRequest, length: int) -> Refusal:
        """A chunked body that grew over the limit: 413 in the route's shape."""
        headers = request.requestHeaders
        answer = self._checks.early_reject(request.method, request.uri, headers, length)
        return self._refusal(request, answer)

    @staticmethod
    def _refusal(request: ServerRequest, answer: EarlyResponse) -> Refusal:
        given = request.getHeader(b"x-request-id")
        response = refusal_bytes(answer.status, answer.body, answer.headers, given, None)
        return Refusal(answer.status, "", response)

    def refusal_response(
        self, status: int, message: str, headers: HeaderMap, retry_after: int | None = None
    ) -> bytes:
        body = json.dumps({"error": message}).encode("utf-8")
        given = headers.getRawHeaders(b"x-request-id", [None])[-1]
        extra = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return refusal_bytes(status, body, extra, given, self._request_id)
