"""The model server's HTTP surface (Klein): thin routes over :class:`ModelRuntime`.

Routes (see docs/api.md): ``GET /healthz``, ``GET /ready``, ``GET /metrics``,
``GET /openapi.json`` (public); ``POST <server_uri>`` (sync inference);
``POST /jobs``, ``GET /jobs/{id}``, ``GET /jobs/{id}/wait?timeout=ms``,
``GET /jobs/{id}/result`` (async, 404 unless ``async_enabled``).

POST pre-check order: 405 → 401 → 415 → 413 (before the body is read; see
:mod:`mortred_twisted.http.limits`) → 400 → 422 → 429. The 202 of ``POST /jobs``
is returned at admission; the job series is started by the runner, independently
of this request. ``/jobs/{id}/wait`` hangs on a named counter raced against a
reactor timer: no thread blocks, nothing polls.

Thread contract: reactor thread only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.http import Headers
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.http import errors as E
from mortred_twisted.http.auth import WWW_AUTHENTICATE, bearer_token, token_matches
from mortred_twisted.http.envelope import parse_envelope, render_error, render_success
from mortred_twisted.http.errors import ApiError, to_api_error
from mortred_twisted.http.fastpath import FastRoutes
from mortred_twisted.http.limits import EarlyResponse
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.http.ratelimit import RateLimiter
from mortred_twisted.jobs.ledger import JobSnapshot
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.model_runtime import ModelRuntime

log = Logger()

JSON_TYPE = b"application/json; charset=utf-8"
WAIT_DEFAULT_MS = 30_000
#: Reason phrases twisted.web does not know.
REASONS: dict[int, bytes] = {422: b"Unprocessable Entity", 429: b"Too Many Requests"}
WAIT_CAP_MS = 300_000


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def is_json_content_type(value: bytes | None) -> bool:
    """``application/json`` (any charset) or a ``+json`` type."""
    if value is None:
        return False
    mime = value.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or mime.endswith(b"+json")


def parse_wait_timeout(raw: bytes | None) -> int:
    """The wait budget in ms: default 30000, capped at 300000; ValueError if invalid."""
    if raw is None or raw == b"":
        return WAIT_DEFAULT_MS
    text = raw.decode("latin-1").strip()
    if not text.isdigit():
        raise ValueError(text)
    return min(int(text), WAIT_CAP_MS)


class ModelServerApp:
    """Klein routes of one model server. Build with :meth:`resource` for a Site."""

    def __init__(
        self,
        runtime: ModelRuntime,
        *,
        rate_limiter: RateLimiter | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self._token = self.config.auth_token or None
        self._rate_limiter = rate_limiter
        self._wall_clock = wall_clock
        self._openapi_bytes: bytes | None = None
        self._metric_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.app = Klein()
        route = self.app.route
        self._routes: dict[str, tuple[str, ...]] = {}

        def add(path: str, methods: tuple[str, ...], label: str, handler: Callable) -> None:
            self._routes[path] = methods
            route(path, methods=list(methods), strict_slashes=False)(
                self._instrumented(label, handler)
            )

        add("/healthz", ("GET",), "healthz", self.healthz)
        add("/ready", ("GET",), "ready", self.ready)
        add("/metrics", ("GET",), "metrics", self.metrics)
        add("/openapi.json", ("GET",), "openapi", self.openapi)
        add(self.config.server_uri, ("POST",), "infer", self.infer)
        add("/jobs", ("POST",), "jobs_submit", self.submit_job)
        add("/jobs/<job_id>", ("GET",), "jobs_status", self.job_status)
        add("/jobs/<job_id>/wait", ("GET",), "jobs_wait", self.job_wait)
        add("/jobs/<job_id>/result", ("GET",), "jobs_result", self.job_result)
        self.app.handle_errors(MethodNotAllowed)(self._method_not_allowed)
        self.app.handle_errors(NotFound)(self._not_found)

    def resource(self) -> Any:
        """The root resource: hot routes dispatched by hand, the rest by Klein."""
        return FastRoutes(
            self.app.resource(),
            infer_path=self.config.server_uri.encode("utf-8"),
            infer=self._instrumented("infer", self.infer),
            submit=self._instrumented("jobs_submit", self.submit_job),
            status=self._instrumented("jobs_status", self.job_status),
            wait=self._instrumented("jobs_wait", self.job_wait),
            result=self._instrumented("jobs_result", self.job_result),
        )

    def klein_resource(self) -> Any:
        """Klein alone (every route through werkzeug), for comparison and tests."""
        return self.app.resource()

    @property
    def routes(self) -> dict[str, tuple[str, ...]]:
        """Registered path templates (Klein syntax) -> methods; for the OpenAPI test."""
        return dict(self._routes)

    # -- plumbing ---------------------------------------------------------------------

    def _instrumented(self, label: str, handler: Callable) -> Callable:
        """Tag the request with its route and start time; :meth:`record_request`
        (called by the site when the response is finished) counts it."""

        def endpoint(request: IRequest, **kwargs: Any) -> Any:
            request.mortred_route = label  # type: ignore[attr-defined]
            request.mortred_started = time.perf_counter()  # type: ignore[attr-defined]
            return handler(request, **kwargs)

        # Klein names werkzeug endpoints after the function: keep them distinct.
        endpoint.__name__ = endpoint.__qualname__ = f"mortred_{label}"
        return endpoint

    def record_request(self, request: IRequest) -> None:
        """Count a finished request (the site's per-request hook; reactor thread)."""
        label = getattr(request, "mortred_route", None)
        if label is None:
            return
        key = (label, request.code)
        children = self._metric_children.get(key)
        if children is None:
            metrics = self.runtime.metrics
            children = (
                metrics.http_requests.labels(route=label, code=str(request.code)),
                metrics.http_duration.labels(route=label),
            )
            self._metric_children[key] = children
        children[0].inc()
        children[1].observe((time.perf_counter() - request.mortred_started) * 1000.0)

    @staticmethod
    def _headers(request: IRequest, req_id: str | None) -> None:
        request.setHeader(b"Content-Type", JSON_TYPE)
        request.setHeader(b"Cache-Control", b"no-store")
        if req_id:
            request.setHeader(b"X-Request-ID", req_id.encode("utf-8", "replace"))

    def _respond(
        self,
        request: IRequest,
        status: int,
        body: bytes,
        req_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        request.setResponseCode(status, REASONS.get(status))
        self._headers(request, req_id)
        request.setHeader(b"Content-Length", str(len(body)).encode())
        for name, value in (headers or {}).items():
            request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
        return body

    def _envelope_error(self, request: IRequest, err: ApiError, req_id: str) -> bytes:
        return self._respond(
            request, err.http_status, render_error(req_id, err.code, err.message), req_id,
            err.headers,
        )  # fmt: skip

    def _job_error(self, request: IRequest, err: ApiError, req_id: str | None = None) -> bytes:
        body = _json_bytes({"error": err.message, "code": err.code})
        return self._respond(request, err.http_status, body, req_id, err.headers)

    @staticmethod
    def _header(request: IRequest, name: bytes) -> bytes | None:
        return request.requestHeaders.getRawHeaders(name, [None])[0]

    def _request_id_header(self, request: IRequest) -> str | None:
        raw = self._header(request, b"x-request-id")
        return raw.decode("utf-8", "replace")[:256] if raw else None

    def _auth_error(self, headers: Headers) -> ApiError | None:
        if self._token is None:
            return None
        given = bearer_token(headers.getRawHeaders(b"authorization", [None])[0])
        if token_matches(given, self._token):
            return None
        message = "missing bearer token" if given is None else "invalid bearer token"
        return ApiError(E.UNAUTHORIZED, message, {"WWW-Authenticate": WWW_AUTHENTICATE})

    def _post_prechecks(self, request: IRequest) -> ApiError | None:
        """401 → 415 → 413, from headers (the body limit was enforced while reading)."""
        err = self._auth_error(request.requestHeaders)
        if err is not None:
            return err
        if not is_json_content_type(self._header(request, b"content-type")):
            return ApiError(E.UNSUPPORTED_MEDIA_TYPE, "content type must be application/json")
        content = request.content
        size = content.seek(0, 2)
        content.seek(0)
        if size > self.config.request_size_limit_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> ApiError:
        return ApiError(
            E.ENTITY_TOO_LARGE,
            f"request body exceeds request_size_limit ({self.config.request_size_limit} MB)",
        )

    def early_reject(
        self, method: bytes, path: bytes, headers: Headers, length: int
    ) -> EarlyResponse:
        """The response for a body over the limit, honouring 405 → 401 → 415 → 413."""
        route_path = path.split(b"?", 1)[0].decode("latin-1")
        is_job_route = route_path == "/jobs" or route_path.startswith("/jobs/")
        post_paths = {self.config.server_uri.rstrip("/") or "/", "/jobs"}
        err: ApiError | None = None
        if route_path.rstrip("/") not in post_paths or method.upper() != b"POST":
            allow = "POST" if route_path.rstrip("/") in post_paths else "GET"
            err = ApiError(E.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": allow})
        if err is None:
            err = self._auth_error(headers)
        if err is None and not is_json_content_type(
            headers.getRawHeaders(b"content-type", [None])[0]
        ):
            err = ApiError(E.UNSUPPORTED_MEDIA_TYPE, "content type must be application/json")
        if err is None:
            err = self._too_large()
        rid_raw = headers.getRawHeaders(b"x-request-id", [b""])[0]
        req_id = rid_raw.decode("utf-8", "replace")
        if is_job_route:
            body = _json_bytes({"error": err.message, "code": err.code})
        else:
            body = render_error(req_id, err.code, err.message)
        hdrs = dict(err.headers)
        if req_id:
            hdrs["X-Request-ID"] = req_id
        return EarlyResponse(err.http_status, body, hdrs)

    def _not_ready(self) -> ApiError:
        rt = self.runtime
        detail = f": {rt.load_error}" if rt.load_error else ""
        return ApiError(E.NOT_READY, f"model not ready ({rt.readiness.value}){detail}")

    def _rate_limited(self, request: IRequest) -> ApiError | None:
        if self._rate_limiter is None:
            return None
        client = request.getClientAddress()
        retry = self._rate_limiter.check(getattr(client, "host", "unknown"))
        if retry == 0:
            return None
        return ApiError(
            E.TOO_MANY_REQUESTS,
            f"rate limit exceeded ({self.config.rate_limit_qps} requests/s per client)",
            {"Retry-After": str(retry)},
        )

    def _parse_and_validate(self, request: IRequest):
        """400 → 503 → 422: parse the envelope and let the model validate params."""
        parsed = parse_envelope(request.content.read(), self._request_id_header(request))
        rt = self.runtime
        if not rt.ready or rt.validator is None:
            raise self._not_ready()
        try:
            return rt.validator.validate(parsed), parsed.req_id
        except Exception as exc:
            raise to_api_error(exc) from exc

    # -- errors from routing ----------------------------------------------------------

    def _method_not_allowed(self, request: IRequest, failure: Any) -> bytes:
        allow = ", ".join(sorted(failure.value.valid_methods or []))
        err = ApiError(E.METHOD_NOT_ALLOWED, "method not allowed", {"Allow": allow})
        if request.path.startswith(b"/jobs"):
            return self._job_error(request, err)
        return self._envelope_error(request, err, self._request_id_header(request) or "")

    def _not_found(self, request: IRequest, failure: Any) -> bytes:
        path = request.path.decode("latin-1")
        err = ApiError(E.NOT_FOUND, f"not found: {path}")
        return self._job_error(request, err)

    # -- public endpoints -------------------------------------------------------------

    def healthz(self, request: IRequest) -> bytes:
        return self._respond(request, 200, b'{"status":"ok"}')

    def ready(self, request: IRequest) -> bytes:
        rt = self.runtime
        doc: dict[str, Any] = {
            "ready": rt.ready,
            "state": rt.readiness.value,
            "model": self.config.model_type,
            "id": self.config.id,
        }
        if rt.ready:
            return self._respond(request, 200, _json_bytes(doc))
        err = self._not_ready()
        doc.update({"code": err.code, "error": err.message})
        return self._respond(request, 503, _json_bytes(doc))

    def metrics(self, request: IRequest) -> bytes:
        body = self.runtime.metrics.render()
        request.setHeader(b"Content-Type", self.runtime.metrics.content_type.encode())
        request.setHeader(b"Content-Length", str(len(body)).encode())
        return body

    def openapi(self, request: IRequest) -> bytes:
        if self._openapi_bytes is None or not self.runtime.ready:
            model = self.runtime.validator
            schema = model.params_schema if model is not None else ()
            self._openapi_bytes = _json_bytes(build_openapi(self.config, schema))
        return self._respond(request, 200, self._openapi_bytes)

    # -- sync inference ---------------------------------------------------------------

    def infer(self, request: IRequest) -> Any:
        req_id = self._request_id_header(request) or ""
        err = self._post_prechecks(request)
        if err is not None:
            return self._envelope_error(request, err, req_id)
        try:
            valid, req_id = self._parse_and_validate(request)
            err = self._rate_limited(request)
            if err is not None:
                raise err
            sync = self.runtime.sync
            assert sync is not None  # ready implies wired
            work = sync.infer(valid)
        except Exception as exc:
            return self._envelope_error(request, to_api_error(exc), req_id)

        def ok(result: Any) -> bytes:
            timing = f"model;dur={result.run_ms:.3f}"
            return self._respond(
                request, 200, render_success(req_id, result.data_json), req_id,
                {"Server-Timing": timing},
            )  # fmt: skip

        def failed(failure: Any) -> bytes:
            api = to_api_error(failure.value)
            if api.code == E.INTERNAL_ERROR:
                log.failure("sync inference failed", failure)
            return self._envelope_error(request, api, req_id)

        return work.addCallbacks(ok, failed)

    # -- async jobs -------------------------------------------------------------------

    def _jobs_disabled(self) -> ApiError | None:
        if self.config.async_enabled:
            return None
        return ApiError(E.NOT_FOUND, "async jobs are not enabled on this server")

    def _job_urls(self, job_id: str) -> dict[str, str]:
        return {"poll_url": f"/jobs/{job_id}", "result_url": f"/jobs/{job_id}/result"}

    def submit_job(self, request: IRequest) -> bytes:
        req_id = self._request_id_header(request) or ""
        err = self._jobs_disabled() or self._post_prechecks(request)
        if err is not None:
            return self._job_error(request, err, req_id)
        rt = self.runtime
        try:
            valid, req_id = self._parse_and_validate(request)
            err = self._rate_limited(request)
            if err is not None:
                raise err
        except Exception as exc:
            return self._job_error(request, to_api_error(exc), req_id)
        job_id = rt.ledger.submit(valid, task_id=req_id)
        if job_id is None:
            rt.metrics.async_rejected.inc()
            full = ApiError(
                E.TOO_MANY_REQUESTS,
                f"async queue full (max {rt.ledger.max_queue})",
                {"Retry-After": "1"},
            )
            return self._job_error(request, full, req_id)
        rt.metrics.job_events["submitted"].inc()
        assert rt.runner is not None
        rt.runner.start(job_id)
        body = {"job_id": job_id, "state": "pending", **self._job_urls(job_id)}
        return self._respond(
            request, 202, _json_bytes(body), req_id, {"Location": f"/jobs/{job_id}"}
        )

    def _status_body(self, snap: JobSnapshot) -> bytes:
        doc: dict[str, Any] = {
            "job_id": snap.job_id,
            "state": snap.state.value,
            "elapsed_ms": snap.elapsed_ms,
        }
        if snap.error is not None:
            doc["error"] = snap.error
        if snap.progress is not None:
            doc["progress"] = {"step": snap.progress[0], "total": snap.progress[1]}
        if snap.queued_ms is not None:
            doc["queued_ms"] = snap.queued_ms
        if snap.completed_unix is not None:
            doc["completed_at"] = round(snap.completed_unix, 6)
        doc["req_id"] = snap.task_id
        doc.update(self._job_urls(snap.job_id))
        return _json_bytes(doc)

    def _job_lookup_error(self, request: IRequest, job_id: str) -> bytes:
        err = ApiError(E.NOT_FOUND, f"job not found: {job_id}")
        return self._job_error(request, err, self._request_id_header(request))

    def _job_get_prechecks(self, request: IRequest) -> ApiError | None:
        return self._jobs_disabled() or self._auth_error(request.requestHeaders)

    def job_status(self, request: IRequest, job_id: str) -> bytes:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        snap = self.runtime.ledger.snapshot(job_id)
        if snap is None:
            return self._job_lookup_error(request, job_id)
        return self._respond(
            request, 200, self._status_body(snap), self._request_id_header(request)
        )

    def job_wait(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        try:
            budget_ms = parse_wait_timeout(request.args.get(b"timeout", [None])[0])
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, f"invalid timeout: {exc}", status=400)
            return self._job_error(request, bad)
        rt = self.runtime
        snap = rt.ledger.snapshot(job_id)
        if snap is None:
            return self._job_lookup_error(request, job_id)
        rid = self._request_id_header(request)
        if snap.terminal:
            rt.metrics.wait_wakeups.labels(reason="immediate").inc()
            return self._respond(request, 200, self._status_body(snap), rid)
        # State changes happen on this (the reactor) thread, so nothing can slip in
        # between the terminal check above and registering the counter below.
        woke = within(
            rt.clock, rt.counters.counter(job_id, 1), budget_ms / 1000.0, cancel_on_expiry=True
        )

        def answer(reason: str) -> bytes:
            rt.metrics.wait_wakeups.labels(reason=reason).inc()
            current = rt.ledger.snapshot(job_id)
            if current is None:  # evicted meanwhile (only possible with tiny retention)
                return self._job_lookup_error(request, job_id)
            return self._respond(request, 200, self._status_body(current), rid)

        def on_budget(failure: Any) -> bytes:
            failure.trap(DeadlineExpired)
            return answer("budget")

        out: Deferred[bytes] = woke.addCallbacks(lambda _name: answer("terminal"), on_budget)
        return out

    def job_result(self, request: IRequest, job_id: str) -> bytes:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        lookup = self.runtime.ledger.take_result(job_id)
        if not lookup.found:
            return self._job_lookup_error(request, job_id)
        if not lookup.done:
            assert lookup.state is not None
            conflict = ApiError(
                E.JOB_NOT_FINISHED, f"job not finished (state: {lookup.state.value})"
            )
            return self._job_error(request, conflict, lookup.task_id)
        return self._respond(
            request, 200, render_success(lookup.task_id, lookup.result), lookup.task_id
        )
