"""The gateway's edge: auth, routing, forwarding, rewriting (reactor thread).

Thin by design: every decision lives in a pure module (:mod:`~mortred_twisted.gateway.
routing`, :mod:`~.rewrite`, :mod:`~.access`) or in the upstream client; this class
parses the request, calls them in the contract's order and renders.

Order for a public route: path shape (404 when nothing matches) → method (405 + Allow)
→ credentials (401 + WWW-Authenticate, 403 scope, 429 + Retry-After per key) → model id
(404) → forward. The body-size limit (413) runs earlier, in the ``Site``'s request.
Gateway-made errors are ``{"error": "..."}`` JSON; upstream statuses and bodies pass
through unchanged, except job URLs: the submit's 202 ``Location`` and the
``poll_url``/``result_url`` fields (of the 202 and of 200 poll/wait views, which
repeat them) are rewritten to ``/v1/models/<id>/jobs/...``.

:meth:`GatewayApp.dispatch` matches every path by hand and works on any request object
with the ``IRequest`` subset it uses. The gateway serves it through its own lean
HTTP/1.1 server (:mod:`mortred_twisted.gateway.server`); :class:`GatewayResource`
serves the same method under twisted.web, and the Klein app routes everything to it
(:meth:`GatewayApp.klein_resource`); tests check all three answer alike. A client
that disconnects cancels the forward's Deferred, which cancels the
upstream request. Per-request metrics are plain counters
(:class:`~mortred_twisted.gateway.metrics.HotPathStats`).
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from mortred_twisted.config.catalog import Catalog
from mortred_twisted.gateway.access import INFERENCE, METRICS, AccessPolicy, Decision
from mortred_twisted.gateway.metrics import GatewayMetrics
from mortred_twisted.gateway.rewrite import public_job_path, rewrite_job_urls
from mortred_twisted.gateway.routing import (
    Route,
    RouteError,
    RouteKind,
    Upstreams,
    check_method,
    match,
    resolve,
)
from mortred_twisted.gateway.upstream import UpstreamClient, UpstreamError, UpstreamUnavailable
from mortred_twisted.http.auth import CLIENT_IP_HEADER, WWW_AUTHENTICATE
from mortred_twisted.http.fastpath import respond_when_fired

log = Logger()

JSON = b"application/json; charset=utf-8"
#: A client's X-Request-ID is forwarded only if it is a short visible-ASCII token.
_REQUEST_ID = re.compile(rb"^[\x21-\x7e]{1,128}$")
#: Request headers forwarded upstream (everything else is dropped; Authorization is
#: replaced by the internal token).
_FORWARD_REQUEST = (b"content-type", b"accept", b"user-agent")
#: Response headers never copied back (hop-by-hop or recomputed here).
_DROP_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"date",
    b"server",
}


def request_ids() -> Callable[[], str]:
    """Fresh X-Request-IDs: 32 hex digits, a random per-process prefix and a counter
    (unique per process, not secret; ``uuid4`` costs a ``getrandom`` call each)."""
    prefix = uuid.uuid4().hex[:16]
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):016x}"


class GatewayApp:
    """One gateway's routes. Collaborators are injected; nothing here touches the
    global reactor. Use from the reactor thread only."""

    app = Klein()

    def __init__(
        self,
        *,
        catalog: Catalog,
        policy: AccessPolicy,
        upstream: UpstreamClient,
        clock: IReactorTime,
        metrics: GatewayMetrics | None = None,
        internal_token: str = "",
        request_id: Callable[[], str] | None = None,
    ) -> None:
        self.catalog = catalog
        self.policy = policy
        self.upstream = upstream
        self.clock = clock
        self.metrics = metrics or GatewayMetrics()
        self.internal_token = internal_token
        self._auth_header = (
            [b"Bearer " + internal_token.encode("latin-1")] if internal_token else None
        )
        self._request_id = request_id or request_ids()
        #: ids served by several processes (replicas, remote upstreams): who gets what
        self.upstreams = Upstreams(catalog, clock.seconds)

    def resource(self) -> Any:
        """``dispatch`` as a twisted.web root resource (:class:`GatewayResource`)."""
        return GatewayResource(self)

    def klein_resource(self) -> Any:
        """The same :meth:`dispatch` behind Klein (kept to check both answer alike)."""
        return self.app.resource()

    # -- rendering ----------------------------------------------------------------

    def _error(
        self,
        request: Any,
        status: int,
        message: str,
        route: str,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", JSON)
        request.setHeader(b"Cache-Control", b"no-store")
        for name, value in (headers or {}).items():
            request.setHeader(name.encode("ascii"), value.encode("latin-1"))
        self.metrics.hot.count(route, str(status))
        body = json.dumps({"error": message}).encode("utf-8")
        request.setHeader(b"Content-Length", str(len(body)).encode("ascii"))
        return body

    def _denied(self, request: Any, decision: Decision, route: str) -> bytes:
        self.metrics.auth_failures.labels(decision.reason or str(decision.status)).inc()
        headers: dict[str, str] = {}
        if decision.status == 401:
            headers["WWW-Authenticate"] = WWW_AUTHENTICATE
        if decision.retry_after is not None:
            headers["Retry-After"] = str(decision.retry_after)
        message = "unauthorized" if decision.status == 401 else decision.message
        return self._error(request, decision.status, message, route, headers)

    # -- routes ---------------------------------------------------------------------

    @app.route("/", branch=True)
    def dispatch(self, request: Any) -> Any:
        """Every path: health, metrics, the T15 table and the legacy sync routes."""
        path = request.path.decode("latin-1")
        method = request.method.decode("ascii", "replace")
        rid = request.getHeader(b"x-request-id")
        if not rid or not _REQUEST_ID.match(rid):
            rid = self._request_id().encode("ascii")  # absent or not a sane token: ours
        request.setHeader(b"X-Request-ID", rid)
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                return self._error(request, 405, "method not allowed", "healthz", {"Allow": "GET"})
            request.setHeader(b"Content-Type", JSON)
            request.setHeader(b"Content-Length", b"15")
            self.metrics.hot.count("healthz", "200")
            return b'{"status":"ok"}'
        if path == "/metrics":
            return self._metrics(request, method)
        m = match(path, self.catalog)
        if m is None:
            return self._error(request, 404, f"not found: {path}", "unrouted")
        label = m.kind.value
        try:
            check_method(m, method)
        except RouteError as e:
            return self._error(request, e.status, e.message, label, e.headers)
        decision = self.policy.decide(request.getHeader(b"authorization"), INFERENCE)
        if not decision.allowed:
            return self._denied(request, decision, label)
        query = request.uri.partition(b"?")[2].decode("latin-1")
        try:
            route = resolve(m, self.catalog, query, self.upstreams)
        except RouteError as e:
            return self._error(request, e.status, e.message, label, e.headers)
        return self._forward(request, route, method, rid)

    def _metrics(self, request: Any, method: str) -> bytes:
        if method not in ("GET", "HEAD"):
            return self._error(request, 405, "method not allowed", "metrics", {"Allow": "GET"})
        decision = self.policy.decide(request.getHeader(b"authorization"), METRICS)
        if not decision.allowed:
            return self._denied(request, decision, "metrics")
        request.setHeader(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8")
        self.metrics.hot.count("metrics", "200")
        return self.metrics.render()

    def _forward(
        self, request: Any, route: Route, method: str, rid: bytes
    ) -> defer.Deferred[bytes]:
        """Forward to the model; the Deferred fires with the body to send (status and
        headers already set). Cancelling it cancels the upstream request."""
        headers: dict[bytes, list[bytes]] = {}
        get = request.requestHeaders.getRawHeaders
        for name in _FORWARD_REQUEST:
            values = get(name)
            if values:
                headers[name] = values
        headers[b"x-request-id"] = [rid]
        if self._auth_header is not None:
            headers[b"authorization"] = self._auth_header
            # Per-client limits on the model (believed there only with the token).
            headers[CLIENT_IP_HEADER] = [getattr(request.getClientAddress(), "host", "").encode()]
        data = None
        content = request.content
        if content is not None:
            content.seek(0, 2)
            length = content.tell()
            if length:
                data = self.upstream.body_for(content, length)
        started = self.clock.seconds()
        hot = self.metrics.hot
        hot.inflight += 1
        route.start()
        d = self.upstream.request(method, route.url, headers, data)
        d.addCallbacks(
            self._answer,
            self._failed,
            callbackArgs=(request, route, started),
            errbackArgs=(request, route, started),
        )
        return d

    def _settle(self, route: Route, started: float) -> None:
        hot = self.metrics.hot
        hot.inflight -= 1
        route.finish()
        hot.observe(route.kind.value, (self.clock.seconds() - started) * 1000.0)

    def _failed(self, failure: Any, request: Any, route: Route, started: float) -> bytes:
        self._settle(route, started)
        label = route.kind.value
        if failure.check(defer.CancelledError):
            self.metrics.hot.count(label, "499")
            failure.raiseException()
        if not failure.check(UpstreamError):
            failure.raiseException()
        if failure.check(UpstreamUnavailable):  # refused: it never reached that replica
            other = route.elsewhere()
            if other is not None:
                method = request.method.decode("ascii", "replace")
                rid = request.responseHeaders.getRawHeaders(b"x-request-id", [b""])[0]
                return self._forward(request, other, method, rid)
        e = failure.value
        self.metrics.upstream_errors.labels(type(e).__name__).inc()
        log.warn(
            "upstream {model} {path}: {status} {message}",
            model=route.entry.id,
            path=route.upstream_path,
            status=e.status,
            message=e.message,
        )
        return self._error(request, e.status, f"{route.entry.id}: {e.message}", label)

    def _answer(self, response: Any, request: Any, route: Route, started: float) -> bytes:
        self._settle(route, started)
        code = response.code
        request.setResponseCode(code)
        out = request.responseHeaders
        pairs = getattr(response.headers, "pairs", None)
        if pairs is not None:  # the lean client's RawHeaders: (name, value) as received
            seen: set[bytes] = set()
            for name, value in pairs:
                low = name.lower()
                if low in _DROP_RESPONSE:
                    continue
                if low in seen:
                    out.addRawHeader(name, value)
                else:
                    seen.add(low)
                    out.setRawHeaders(name, [value])
        else:
            for name, values in response.headers.getAllRawHeaders():
                if name.lower() not in _DROP_RESPONSE:
                    out.setRawHeaders(name, values)
        body = response.body
        kind = route.kind
        if kind is RouteKind.SUBMIT and code == 202:
            location = response.headers.getRawHeaders(b"location")
            if location:
                new = public_job_path(location[0].decode("latin-1"), route.entry.id)
                request.setHeader(b"Location", new.encode("latin-1"))
            body = rewrite_job_urls(body, route.entry.id)
        elif (kind is RouteKind.POLL or kind is RouteKind.WAIT) and code == 200:
            # The model repeats poll_url/result_url in job views: keep them public too.
            body = rewrite_job_urls(body, route.entry.id)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        self.metrics.hot.count(kind.value, str(code))
        return body


class GatewayResource(Resource):
    """Root leaf resource calling :meth:`GatewayApp.dispatch` directly.

    :meth:`GatewayApp.dispatch` already matches every path by hand, so Klein's
    per-request werkzeug matching and Deferred plumbing buy nothing here; this does
    what Klein did with the result: bytes are the answer; a Deferred is written when
    it fires, and cancelled (cancelling the upstream request) when the client goes
    away first; an unexpected failure is a 500. Reactor thread only.
    """

    isLeaf = True
    #: Every path is matched in :meth:`render` (``postpath`` is never read), so
    #: :class:`~mortred_twisted.http.limits.LimitedRequest` skips traversal.
    matches_paths_itself = True

    def __init__(self, app: GatewayApp) -> None:
        super().__init__()
        self._app = app

    def render(self, request: Any) -> Any:
        outcome = self._app.dispatch(request)
        if not isinstance(outcome, defer.Deferred):
            return outcome
        respond_when_fired(request, outcome)
        return NOT_DONE_YET
