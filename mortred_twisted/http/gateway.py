"""The gateway's edge: auth, routing, forwarding, rewriting (reactor thread).

Thin by design: every decision lives in a pure module (:mod:`~mortred_twisted.gateway.
routing`, :mod:`~.rewrite`, :mod:`~.access`) or in the upstream client; this class
parses the request, calls them in the contract's order and renders.

Order for a public route: path shape (404 when nothing matches) → method (405 + Allow)
→ credentials (401 + WWW-Authenticate, 403 scope, 429 + Retry-After per key) → model id
(404) → forward. For a request that carries a body all of that is decided from its
head (:meth:`GatewayApp.refuse_head`, then 413 for a body on a route that takes
none, 415 for a non-JSON body on a POST route, then the body-size limit, 413),
before any of the body is read.
Gateway-made errors are ``{"error": "..."}`` JSON; upstream statuses and bodies pass
through unchanged, except job URLs: the submit's 202 ``Location`` and the
``poll_url``/``result_url`` fields (of the 202, of 200 poll/wait views and cancel
answers, which repeat them, of each job of a listing and of each event's ``data:``)
are rewritten to ``/v1/models/<id>/jobs/...``, and a model's OpenAPI document
(``GET /v1/models/<id>/openapi.json``) gets the gateway's paths and security
(:mod:`~mortred_twisted.gateway.openapi`).

**Callers.** Every job request forwarded (submit, poll, wait, result, cancel, listing,
events) names its caller to the model server: ``X-Mortred-Principal`` (the
:class:`~mortred_twisted.gateway.access.Decision`'s ``caller``: ``key:<name>`` for an
API key) and ``X-Mortred-Principal-Scope: all`` for callers that list every job.
Request headers reach the model only from an allowlist, so a client's own
``X-Mortred-Principal*`` headers never do. ``Idempotency-Key`` is forwarded on a
submit (the model scopes keys per principal, so per API key), ``Last-Event-ID`` on
an event stream; the model's ``Idempotent-Replayed`` comes back like any header.

**Event streams** (``GET …/jobs/{job}/events``) are forwarded as streams on a
dedicated upstream connection (``LeanUpstreamClient.stream``) and relayed by
:mod:`~mortred_twisted.gateway.events`: each complete record is written to the
client as soon as it arrives (chunked), the stream ends when the model's does, a
client that goes away aborts the upstream connection (the model's stream ends with
it), and an upstream that breaks off mid-stream cuts the client's answer
(:class:`~mortred_twisted.http11.messages.StreamCut`).

:meth:`GatewayApp.dispatch` matches every path by hand; the gateway is served by the
project's one HTTP/1.1 server (:mod:`mortred_twisted.http11.server`), which asks
:meth:`GatewayApp.refuse_head` about a request with a body before reading it. A
client that disconnects cancels the forward's Deferred, which cancels the upstream
request. Per-request metrics are plain counters
(:class:`~mortred_twisted.gateway.metrics.HotPathStats`).
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mortred_twisted.config.catalog import Catalog
from mortred_twisted.gateway.access import INFERENCE, METRICS, AccessPolicy, Decision
from mortred_twisted.gateway.events import is_event_stream, relay
from mortred_twisted.gateway.metrics import GatewayMetrics
from mortred_twisted.gateway.openapi import NotADocument, public_openapi
from mortred_twisted.gateway.rewrite import (
    gateway_prefix,
    public_job_path,
    rewrite_file_urls,
    rewrite_job_urls,
)
from mortred_twisted.gateway.routing import (
    Route,
    RouteError,
    RouteKind,
    Upstreams,
    check_method,
    match,
    resolve,
)
from mortred_twisted.http.protocols.openai_images import (
    error_body,
    public_base,
    public_image_urls,
)
from mortred_twisted.http.protocols.replicate import public_prediction_urls
from mortred_twisted.http.responder import is_json_content_type
from mortred_twisted.http11.auth import CLIENT_IP_HEADER, WWW_AUTHENTICATE, host_refusal
from mortred_twisted.http11.messages import StreamCut
from mortred_twisted.http11.upstream import (
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
    UpstreamUnavailable,
)
from mortred_twisted.http11.upstream_stream import UpstreamStream, relay_body
from mortred_twisted.supervisor.child_contract import (
    CHALLENGE_HEADER,
    PROOF_HEADER,
    answer_challenge,
)

log = Logger()

JSON = b"application/json; charset=utf-8"
#: A client's X-Request-ID is forwarded only if it is a short visible-ASCII token.
_REQUEST_ID = re.compile(rb"^[\x21-\x7e]{1,128}$")
#: Request headers forwarded upstream (everything else is dropped; Authorization is
#: replaced by the internal token, the caller's X-Mortred-Principal* set here).
_FORWARD_REQUEST = (b"content-type", b"accept", b"user-agent")
#: ... plus one header on some routes.
_FORWARD_BY_KIND = {
    RouteKind.SUBMIT: b"idempotency-key",
    RouteKind.OPENAI_IMAGES: b"idempotency-key",
    RouteKind.OPENAI_EDITS: b"idempotency-key",
    RouteKind.OIP_INFER: b"inference-header-content-length",  # its binary mode
    RouteKind.REPLICATE_POST: b"idempotency-key",
    RouteKind.EVENTS: b"last-event-id",
}
#: ... and a submit's or sync call's ``Prefer`` (``return=inline``: result files inline).
_FORWARD_PREFER = frozenset(
    {RouteKind.SUBMIT, RouteKind.INFER, RouteKind.OPENAI_IMAGES, RouteKind.OPENAI_EDITS,
     RouteKind.REPLICATE_POST}
)  # fmt: skip
#: ... and a result file's conditional and range headers.
_FORWARD_FILE = (b"range", b"if-none-match", b"if-range")
#: Routes that name their caller to the model (every job route).
_JOB_ROUTES = frozenset(
    {
        RouteKind.SUBMIT,
        RouteKind.POLL,
        RouteKind.WAIT,
        RouteKind.RESULT,
        RouteKind.CANCEL,
        RouteKind.LIST,
        RouteKind.EVENTS,
        RouteKind.QUEUE,
        RouteKind.FILE,
        RouteKind.OPENAI_IMAGES,  # a submit through the OpenAI door
        RouteKind.OPENAI_EDITS,
        RouteKind.OIP_INFER,  # and through the OIP door
        RouteKind.REPLICATE_READ,  # and the Replicate door's predictions
        RouteKind.REPLICATE_POST,
    }
)
#: Routes that send the caller's fair-share terms (fair_share.py) with its principal.
_TERMS_ROUTES = frozenset(
    {RouteKind.SUBMIT, RouteKind.QUEUE, RouteKind.OPENAI_IMAGES, RouteKind.OPENAI_EDITS,
     RouteKind.OIP_INFER, RouteKind.REPLICATE_POST}
)  # fmt: skip
#: The OpenAI door's routes that answer pictures (their URLs are made public).
_OPENAI_PICTURES = frozenset({RouteKind.OPENAI_IMAGES, RouteKind.OPENAI_EDITS})
#: The Replicate door's routes (their answers' URLs are made public).
_REPLICATE = frozenset({RouteKind.REPLICATE_READ, RouteKind.REPLICATE_POST})
#: Routes whose body must be JSON (415 from the head otherwise, as on the model);
#: the only routes that take a body (any other answers one 413 from the head).
_JSON_BODY = frozenset(
    {RouteKind.INFER, RouteKind.SUBMIT, RouteKind.LEGACY, RouteKind.OPENAI_IMAGES,
     RouteKind.OPENAI_EDITS, RouteKind.OIP_INFER, RouteKind.REPLICATE_POST}
)  # fmt: skip
#: Routes that may also take a ``multipart/form-data`` submit (the model port decides:
#: an SDK model takes it, a built-in family answers 415).
_FORM_BODY = frozenset({RouteKind.INFER, RouteKind.SUBMIT, RouteKind.OPENAI_EDITS})


def _is_form(content_type: bytes | None) -> bool:
    return content_type is not None and (
        content_type.split(b";", 1)[0].strip().lower() == b"multipart/form-data"
    )


#: 2xx answers whose JSON body repeats job URLs.
_REWRITTEN = {
    RouteKind.POLL: (200,),
    RouteKind.WAIT: (200,),
    RouteKind.CANCEL: (200, 202),
    RouteKind.LIST: (200,),
}
PRINCIPAL = b"x-mortred-principal"
PRINCIPAL_SCOPE = b"x-mortred-principal-scope"
_SCOPE_ALL = [b"all"]
#: Response headers never copied back (hop-by-hop or recomputed here).
_DROP_RESPONSE = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"content-length",
    b"date",
    b"server",
    b"x-content-type-options",  # the gateway's server adds its own nosniff to every answer
}


def _unless_file(stream: UpstreamStream) -> Any:
    """A result file's upstream answer: the stream of a 200/206 (relayed as it
    comes), any other answer read whole (an ``UpstreamResponse``)."""
    if stream.code in (200, 206):
        return stream
    return stream.read_all().addCallback(
        lambda body: UpstreamResponse(stream.code, stream.headers, body)
    )


def _whole_only(answer: Any, check: Callable[[Any, Any], Any], route: Any) -> Any:
    """``check(answer, route)`` for a whole answer; a stream passes as it is."""
    return check(answer, route) if isinstance(answer, UpstreamResponse) else answer


def request_ids() -> Callable[[], str]:
    """Fresh X-Request-IDs: 32 hex digits, a random per-process prefix and a counter
    (unique per process, not secret; ``uuid4`` costs a ``getrandom`` call each)."""
    prefix = uuid.uuid4().hex[:16]
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):016x}"


class GatewayApp:
    """One gateway's routes. Collaborators are injected; nothing here touches the
    global reactor. Use from the reactor thread only."""

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
        cold_start: Any = None,
        admission: Any = None,
        spawn_key: str | None = None,
    ) -> None:
        self.catalog = catalog
        #: the supervisor's per-spawn secret: ``/healthz`` proves the process holds it
        #: (:mod:`~mortred_twisted.supervisor.child_contract`); None when unsupervised
        self.spawn_key = spawn_key
        #: holds requests for autoscaled ids with no replica up (gateway/cold_start.py)
        self.cold_start = cold_start
        #: ... or admits their submits here, in the shared store (http/gateway_admission.py)
        self.admission = admission
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
        doc = error_body(status, message) if route.startswith("openai_") else {"error": message}
        body = json.dumps(doc).encode("utf-8")
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

    def dispatch(self, request: Any) -> Any:
        """Every path: health, metrics, the T15 table and the legacy sync routes."""
        judged = request.decided or self._judge(request)
        if type(judged) is bytes:
            return judged
        route, decision, rid, method = judged
        headers = self._forward_headers(request, route.kind, rid, decision)
        data = None
        content = request.content
        if content is not None:
            content.seek(0, 2)
            length = content.tell()
            if length:
                data = self.upstream.body_for(content, length)
        answer = self._forward(request, route, method, headers, data)
        if route.kind is RouteKind.SUBMIT and decision.caller.startswith(b"key:"):
            answer.addCallback(self._count_key_submit, request, decision.principal)
        return answer

    def _count_key_submit(self, body: bytes, request: Any, key: str) -> bytes:
        self.metrics.key_submits.count(key, getattr(request, "code", 0))
        return body

    def refuse_head(self, request: Any, length: int) -> bytes | None:
        """The server's question on the head of a request that carries a body
        (before any of it is read or ``100 Continue`` is sent): the answer when the
        route, method, credentials, model id or ``Content-Type`` refuse it (404,
        405, 401, 403, 429, 415), or the route takes no body (health, metrics, job
        reads, cancel: 413), else None, and :meth:`dispatch` goes on from what was
        decided here (the per-key rate limit is taken once)."""
        path = request.path
        if (path == b"/healthz" or path == b"/metrics") and request.method in (b"GET", b"HEAD"):
            label = path[1:].decode("ascii")
            return self._error(request, 413, f"{label} takes no request body", label)
        judged = self._judge(request)
        if isinstance(judged, bytes):
            return judged
        route = judged[0]
        if route.kind not in _JSON_BODY:
            label = route.kind.value
            return self._error(request, 413, f"{label} takes no request body", label)
        content_type = request.getHeader(b"content-type")
        if route.kind is RouteKind.OIP_INFER:  # JSON or binary tensors, typed or not
            pass
        elif not is_json_content_type(content_type) and not (
            route.kind in _FORM_BODY and _is_form(content_type)
        ):
            return self._error(
                request, 415, "content type must be application/json", route.kind.value
            )
        request.decided = judged
        return None

    def _judge(self, request: Any) -> Any:
        """Everything decided before forwarding: the answer (bytes) to a request
        that ends here, or ``(route, decision, request id, method)`` to forward."""
        path = request.path.decode("latin-1")
        method = request.method.decode("ascii", "replace")
        rid = request.getHeader(b"x-request-id")
        if not rid or not _REQUEST_ID.match(rid):
            rid = self._request_id().encode("ascii")  # absent or not a sane token: ours
        request.setHeader(b"X-Request-ID", rid)
        if self.policy.open:  # no token, no keys (loopback only): loopback names only
            refusal = host_refusal(request.getHeader(b"host"), token_configured=False)
            if refusal is not None:
                return self._error(request, 421, refusal, "refused")
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                return self._error(request, 405, "method not allowed", "healthz", {"Allow": "GET"})
            if self.spawn_key is not None:  # the supervisor's probe: prove who we are
                proof = answer_challenge(self.spawn_key, request.getHeader(CHALLENGE_HEADER))
                if proof is not None:
                    request.setHeader(PROOF_HEADER, proof)
            request.setHeader(b"Content-Type", JSON)
            request.setHeader(b"Content-Length", b"15")
            self.metrics.hot.count("healthz", "200")
            return b'{"status":"ok"}'
        if path == "/metrics":
            return self._metrics(request, method)
        shape = match(path, self.catalog)
        if shape is None:
            return self._error(request, 404, f"not found: {path}", "unrouted")
        try:
            m = check_method(shape, method)
        except RouteError as e:
            return self._error(request, e.status, e.message, shape.kind.value, e.headers)
        label = m.kind.value
        decision = self.policy.decide(request.getHeader(b"authorization"), INFERENCE)
        if not decision.allowed:
            return self._denied(request, decision, label)
        query = request.uri.partition(b"?")[2].decode("latin-1")
        try:
            route = resolve(m, self.catalog, query, self.upstreams)
        except RouteError as e:
            return self._error(request, e.status, e.message, label, e.headers)
        return route, decision, rid, method

    def _metrics(self, request: Any, method: str) -> bytes:
        if method not in ("GET", "HEAD"):
            return self._error(request, 405, "method not allowed", "metrics", {"Allow": "GET"})
        decision = self.policy.decide(request.getHeader(b"authorization"), METRICS)
        if not decision.allowed:
            return self._denied(request, decision, "metrics")
        request.setHeader(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8")
        self.metrics.hot.count("metrics", "200")
        return self.metrics.render()

    def _forward_headers(
        self, request: Any, kind: RouteKind, rid: bytes, decision: Decision
    ) -> dict[bytes, list[bytes]]:
        """The request headers sent upstream: the allowlist, never the client's own
        credentials or caller headers (see the module docstring)."""
        headers: dict[bytes, list[bytes]] = {}
        get = request.requestHeaders.getRawHeaders
        for name in _FORWARD_REQUEST:
            values = get(name)
            if values:
                headers[name] = values
        extra = _FORWARD_BY_KIND.get(kind)
        if extra is not None:
            values = get(extra)
            if values:
                headers[extra] = values[:1]
        if kind in _FORWARD_PREFER:
            values = get(b"prefer")
            if values:
                headers[b"prefer"] = values
        if kind is RouteKind.FILE:
            for name in _FORWARD_FILE:
                values = get(name)
                if values:
                    headers[name] = values[:1]
        headers[b"x-request-id"] = [rid]
        if self._auth_header is not None:
            headers[b"authorization"] = self._auth_header
            # Per-client limits on the model (believed there only with the token).
            headers[CLIENT_IP_HEADER] = [getattr(request.getClientAddress(), "host", "").encode()]
            if kind in _JOB_ROUTES:  # believed there only with the token, too
                headers[PRINCIPAL] = [decision.caller]
                if decision.all_jobs:
                    headers[PRINCIPAL_SCOPE] = _SCOPE_ALL
                if kind in _TERMS_ROUTES:
                    for name, value in decision.terms:  # the key's share (fair_share.py)
                        headers[name] = [value]
        return headers

    def _forward(
        self,
        request: Any,
        route: Route,
        method: str,
        headers: dict[bytes, list[bytes]],
        data: bytes | None,
    ) -> defer.Deferred[bytes]:
        """Forward to the model; the Deferred fires with the body to send (status and
        headers already set; a stream's pieces are written as they come). Cancelling
        it cancels the upstream request."""
        started = self.clock.seconds()
        hot = self.metrics.hot
        hot.inflight += 1
        route.start()
        if route.kind is RouteKind.EVENTS:
            d: Any = self.upstream.stream(method, route.url, headers)
            answer: Any = self._stream_head
        elif route.kind is RouteKind.FILE and method == "GET":
            d = self.upstream.stream(method, route.url, headers).addCallback(_unless_file)
            if self.cold_start is not None:  # a draining replica's 503: as refused
                d.addCallback(_whole_only, self.cold_start.refuse_not_ready, route)
            answer = self._file_head
        else:
            d = self.upstream.request(method, route.url, headers, data)
            if self.cold_start is not None:  # a draining replica's 503: as refused
                d.addCallback(self.cold_start.refuse_not_ready, route)
            answer = self._answer
        d.addCallbacks(
            answer,
            self._failed,
            callbackArgs=(request, route, started),
            errbackArgs=(request, route, started, headers, data),
        )
        return d

    def _settle(self, route: Route, started: float) -> None:
        hot = self.metrics.hot
        hot.inflight -= 1
        route.finish()
        hot.observe(route.kind.value, (self.clock.seconds() - started) * 1000.0)

    def _failed(
        self,
        failure: Any,
        request: Any,
        route: Route,
        started: float,
        headers: dict[bytes, list[bytes]],
        data: bytes | None,
    ) -> bytes:
        self._settle(route, started)
        label = route.kind.value
        if failure.check(defer.CancelledError):
            self.metrics.hot.count(label, "499")
            failure.raiseException()
        if not failure.check(UpstreamError):
            failure.raiseException()
        if failure.check(UpstreamUnavailable):  # refused: it never reached that replica
            other = route.elsewhere()
            method = request.method.decode("ascii", "replace")
            if other is not None:
                return self._forward(request, other, method, headers, data)
            if self.cold_start is not None and self.cold_start.covers(route):
                return self._cold(request, route, method, headers, data)
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

    def _cold(
        self,
        request: Any,
        route: Route,
        method: str,
        headers: dict[bytes, list[bytes]],
        data: bytes | None,
    ) -> Any:
        """No replica of an autoscaled id took the request: a submit, poll, wait or
        result answered here from the shared store (:mod:`~mortred_twisted.gateway.
        admission`; an admitted submit wakes the supervisor without waiting for it),
        else the request held until a replica is ready (:mod:`~mortred_twisted.
        gateway.cold_start`)."""
        cold = self.cold_start
        label = route.kind.value

        def hold() -> defer.Deferred[bytes]:
            return cold.hold(
                route,
                lambda again: self._forward(request, again, method, headers, data),
                lambda message, retry_s: self._error(
                    request, 503, message, label, {"Retry-After": str(retry_s)}
                ),
            )

        admission = self.admission
        if admission is None or (
            route.kind is RouteKind.SUBMIT and route.entry.id in cold.unstartable
        ):
            return hold()
        local = admission.serve(route, headers, data)
        if local is None:
            return hold()

        def answered(response: Any) -> Any:
            if response is None:
                return hold()
            if route.kind is RouteKind.SUBMIT and response.code == 202:
                cold.nudge(route.entry.id)
            return self._render(response, request, route)

        return local.addCallback(answered)

    def _answer(self, response: Any, request: Any, route: Route, started: float) -> bytes:
        self._settle(route, started)
        return self._render(response, request, route)

    def _render(self, response: Any, request: Any, route: Route) -> bytes:
        """An upstream's (or the admission's) answer, its job URLs made public."""
        code = response.code
        request.setResponseCode(code)
        self._copy_headers(response.headers, request.responseHeaders)
        body = response.body
        kind = route.kind
        if kind is RouteKind.SUBMIT and code == 202:
            location = response.headers.getRawHeaders(b"location")
            if location:
                new = public_job_path(location[0].decode("latin-1"), route.entry.id)
                request.setHeader(b"Location", new.encode("latin-1"))
            body = rewrite_job_urls(body, route.entry.id)
        elif code in _REWRITTEN.get(kind, ()):
            # The model repeats poll_url/result_url in job views: keep them public too.
            body = rewrite_job_urls(body, route.entry.id)
        elif kind is RouteKind.RESULT and code == 200:  # result files' URLs
            body = rewrite_file_urls(body, gateway_prefix(route.entry.id))
        elif kind in _OPENAI_PICTURES and code in (200, 202):  # its URLs, public
            if code == 202:  # the native job body (Prefer: respond-async)
                body = rewrite_job_urls(body, route.entry.id)
                location = response.headers.getRawHeaders(b"location")
                if location:
                    new = public_job_path(location[0].decode("latin-1"), route.entry.id)
                    request.setHeader(b"Location", new.encode("latin-1"))
            else:
                base = public_base(request.getHeader(b"host"))
                body = public_image_urls(body, gateway_prefix(route.entry.id), base)
        elif kind in _REPLICATE and code in (200, 201):  # its URLs, public
            base = public_base(request.getHeader(b"host"))
            body = public_prediction_urls(body, route.entry.id, base)
        elif kind is RouteKind.OPENAPI and code == 200:  # the paths a client calls here
            entry = route.entry
            try:
                body = public_openapi(body, entry.id, entry.server_uri, not self.policy.open)
            except NotADocument as e:
                return self._error(request, 502, f"{entry.id}: openapi.json: {e}", kind.value)
        if code != 304:  # a 304's may only be the 200's length: none (RFC 9110 8.6)
            request.setHeader(b"Content-Length", b"%d" % len(body))
        self.metrics.hot.count(kind.value, str(code))
        return body

    @staticmethod
    def _copy_headers(headers: Any, out: Any) -> None:
        """The upstream's response headers, less hop-by-hop and recomputed ones."""
        pairs = getattr(headers, "pairs", None)
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
            for name, values in headers.getAllRawHeaders():
                if name.lower() not in _DROP_RESPONSE:
                    out.setRawHeaders(name, values)

    # -- result files -----------------------------------------------------------------

    def _file_head(
        self, stream: UpstreamStream | UpstreamResponse, request: Any, route: Route,
        started: float,
    ) -> Any:  # fmt: skip
        """The model answered a result file's head: a 200/206 is relayed as it comes
        (:func:`~mortred_twisted.http11.upstream_stream.relay_body`: at the client's
        pace, framed by the model's ``Content-Length``, never held whole); any other
        answer (304, an error JSON) is read whole and answered as usual."""
        if isinstance(stream, UpstreamResponse):
            return self._answer(stream, request, route, started)
        label = route.kind.value
        self.metrics.hot.observe(label, (self.clock.seconds() - started) * 1000.0)
        request.setResponseCode(stream.code)
        self._copy_headers(stream.headers, request.responseHeaders)
        self.metrics.hot.count(label, str(stream.code))
        d = relay_body(stream, request)
        d.addErrback(self._file_cut, request, route)
        d.addBoth(self._stream_closed, route)
        return d

    def _file_cut(self, failure: Any, request: Any, route: Route) -> bytes:
        """The model's file answer broke off: 502 if nothing was sent yet, else the
        client's answer is cut (short of its Content-Length)."""
        if request.started:
            return self._broke_off(failure, route)
        request.responseHeaders = type(request.responseHeaders)()
        return self._unread(failure, request, route)

    # -- event streams ----------------------------------------------------------------

    def _stream_head(
        self, stream: UpstreamStream, request: Any, route: Route, started: float
    ) -> defer.Deferred[bytes]:
        """The model answered an event stream's head: relay its records as they come
        (another answer, an error, is read whole and passed on; see
        :mod:`~mortred_twisted.gateway.events`)."""
        hot = self.metrics.hot
        label = route.kind.value
        hot.observe(label, (self.clock.seconds() - started) * 1000.0)
        code = stream.code
        request.setResponseCode(code)
        self._copy_headers(stream.headers, request.responseHeaders)
        hot.count(label, str(code))
        d = relay(stream, request, gateway_prefix(route.entry.id))
        if is_event_stream(stream):
            d.addErrback(self._broke_off, route)
        else:
            d.addErrback(self._unread, request, route)
        d.addBoth(self._stream_closed, route)
        return d

    def _unread(self, failure: Any, request: Any, route: Route) -> bytes:
        failure.trap(UpstreamError)
        e = failure.value
        self.metrics.upstream_errors.labels(type(e).__name__).inc()
        return self._error(request, e.status, f"{route.entry.id}: {e.message}", route.kind.value)

    def _broke_off(self, failure: Any, route: Route) -> bytes:
        """The upstream stream ended without its end (the model went away, or went
        silent): the client's answer is cut too (a client that left: passed on)."""
        failure.trap(UpstreamError)
        e = failure.value
        self.metrics.upstream_errors.labels(type(e).__name__).inc()
        log.warn("upstream {model} {path}: stream broke off: {message}",
                 model=route.entry.id, path=route.upstream_path, message=e.message)  # fmt: skip
        raise StreamCut(e.message)

    def _stream_closed(self, result: Any, route: Route) -> Any:
        self.metrics.hot.inflight -= 1
        route.finish()
        return result
