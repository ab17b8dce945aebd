"""The model server's HTTP surface (Klein): thin routes over :class:`ModelRuntime`.

Routes (see docs/api.md): ``GET /healthz``, ``GET /ready``, ``GET /metrics``,
``GET /openapi.json`` (public); ``POST <server_uri>`` (sync inference);
``POST /jobs``, ``GET /jobs/{id}``, ``GET /jobs/{id}/wait?timeout=ms``,
``GET /jobs/{id}/result`` (async, 404 unless ``async_enabled``).

POST pre-check order: 404 → 405 → 401 → 415 → 413 (from the head, before the body is
read: :meth:`~mortred_twisted.http.edge.EdgeBase.refuse_from_head`) → 400 → 422 →
429. The 202 of ``POST /jobs`` is returned at admission; the job series is started
by the runner, independently of this request. ``/jobs/{id}/wait`` hangs on a named
counter raced against a reactor timer: no thread blocks, nothing polls. Every job
operation goes through the runtime's :class:`~mortred_twisted.jobs.store.JobStore`:
plain answers from the memory store, Deferreds from the shared (Redis) one, which
answers 503 "job store unavailable" while Redis cannot be reached.

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.http import errors as E
from mortred_twisted.http.edge import EdgeBase, json_bytes
from mortred_twisted.http.envelope import render_success
from mortred_twisted.http.errors import ApiError, to_api_error
from mortred_twisted.http.hot_routes import HOT_LABELS, HotRoutes
from mortred_twisted.http.job_control import JobControlRoutes
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, fingerprint
from mortred_twisted.jobs.ledger import Admission, JobSnapshot, ResultLookup
from mortred_twisted.jobs.status import status_body
from mortred_twisted.jobs.store import Maybe, StoreUnavailable, then
from mortred_twisted.jobs.webhooks import WebhookRejected, check_target, parse_events_filter
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.inference import QueueFull
from mortred_twisted.runtime.model_runtime import ModelRuntime

log = Logger()

WAIT_DEFAULT_MS = 30_000
WAIT_CAP_MS = 300_000


def parse_wait_timeout(raw: bytes | None) -> int:
    """The wait budget in ms: default 30000, capped at 300000; ValueError if invalid."""
    if raw is None or raw == b"":
        return WAIT_DEFAULT_MS
    text = raw.decode("latin-1").strip()
    if not text.isdigit():
        raise ValueError(text)
    return min(int(text), WAIT_CAP_MS)


class ModelServerApp(JobControlRoutes, EdgeBase):
    """Klein routes of one model server. Build with :meth:`resource` for a Site."""

    def __init__(
        self,
        runtime: ModelRuntime,
        *,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self._token = self.config.auth_token or None
        self._rate_limiter = rate_limiter
        self._openapi_bytes: bytes | None = None
        self.app = Klein()
        route = self.app.route
        self._routes: dict[str, tuple[str, ...]] = {}
        #: route label -> the instrumented handler Klein registered for it
        self.handlers: dict[str, Callable] = {}

        def add(path: str, methods: tuple[str, ...], label: str, handler: Callable) -> None:
            self._routes[path] = self._routes.get(path, ()) + methods
            endpoint = self._instrumented(label, handler)
            self.handlers[label] = endpoint
            route(path, methods=list(methods), strict_slashes=False)(endpoint)

        add("/healthz", ("GET",), "healthz", self.healthz)
        add("/ready", ("GET",), "ready", self.ready)
        add("/metrics", ("GET",), "metrics", self.metrics)
        add("/openapi.json", ("GET",), "openapi", self.openapi)
        add(self.config.server_uri, ("POST",), "infer", self.infer)
        add("/jobs", ("POST",), "jobs_submit", self.submit_job)
        add("/jobs/<job_id>", ("GET",), "jobs_status", self.job_status)
        add("/jobs/<job_id>/wait", ("GET",), "jobs_wait", self.job_wait)
        add("/jobs/<job_id>/result", ("GET",), "jobs_result", self.job_result)
        add("/jobs", ("GET",), "jobs_list", self.list_jobs)
        add("/jobs/<job_id>", ("DELETE",), "jobs_cancel", self.cancel_job)
        add("/jobs/<job_id>/events", ("GET",), "jobs_events", self.job_events)
        self.app.handle_errors(MethodNotAllowed)(self._method_not_allowed)
        self.app.handle_errors(NotFound)(self._not_found)

    def hot_routes(self) -> HotRoutes:
        """The hand matcher of the hot routes, over the handlers registered above."""
        return HotRoutes(
            self.config.server_uri.encode("utf-8"),
            {label: self.handlers[label] for label in HOT_LABELS},
        )

    @property
    def routes(self) -> dict[str, tuple[str, ...]]:
        """Registered path templates (Klein syntax) -> methods; for the OpenAPI test."""
        return dict(self._routes)

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
            return self._respond(request, 200, json_bytes(doc))
        err = self._not_ready()
        doc.update({"code": err.code, "error": err.message})
        return self._respond(request, 503, json_bytes(doc))

    def metrics(self, request: IRequest) -> bytes:
        body = self.runtime.metrics.render()
        request.setHeader(b"Content-Type", self.runtime.metrics.content_type.encode())
        request.setHeader(b"Content-Length", str(len(body)).encode())
        return body

    def openapi(self, request: IRequest) -> bytes:
        if self._openapi_bytes is None or not self.runtime.ready:
            model = self.runtime.validator
            schema = model.params_schema if model is not None else ()
            output = model.output_schema if model is not None else None
            self._openapi_bytes = json_bytes(build_openapi(self.config, schema, output))
        return self._respond(request, 200, self._openapi_bytes)

    # -- sync inference ---------------------------------------------------------------

    def infer(self, request: IRequest) -> Any:
        req_id = self._request_id(request)
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
        except QueueFull as exc:
            full = to_api_error(exc)
            full.headers["Retry-After"] = self.runtime.retry_after(
                "sync", self.config.max_queue_depth
            )
            return self._envelope_error(request, full, req_id)
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
        req_id = self._request_id(request)
        err = self._jobs_disabled() or self._post_prechecks(request)
        if err is not None:
            return self._job_error(request, err, req_id)
        rt = self.runtime
        job_fields: dict[str, Any] = {}
        try:
            key = check_key(self._header(request, b"idempotency-key"))
            valid, req_id = self._parse_and_validate(request, job_fields)
            webhook = self._webhook_target(job_fields)
            err = self._rate_limited(request)
            if err is not None:
                raise err
        except BadIdempotencyKey as exc:
            return self._job_error(request, ApiError(E.INVALID_REQUEST, str(exc), status=400))
        except Exception as exc:
            return self._job_error(request, to_api_error(exc), req_id)
        owner, _ = self.principal(request)
        fp = ""
        if key is not None:
            request.content.seek(0)
            fp = fingerprint(request.content.read())
        admitted = rt.store.admit(
            valid, req_id, owner=owner, idempotency_key=key, fingerprint=fp, webhook=webhook
        )
        answer = then(admitted, lambda a: self._admitted(request, a, req_id))
        return self._store_errors(request, answer, req_id)

    def _webhook_target(self, fields: dict[str, Any]) -> tuple[str, frozenset[str]] | None:
        """The submitted ``webhook`` and its events, checked against the allowlist."""
        if "webhook" not in fields:
            if "webhook_events_filter" in fields:
                raise ApiError(E.INVALID_REQUEST, "webhook_events_filter: needs a webhook")
            return None
        try:
            url = check_target(fields["webhook"], frozenset(self.config.webhook_allowed_hosts))
            events = parse_events_filter(fields.get("webhook_events_filter"))
        except WebhookRejected as exc:
            raise ApiError(E.INVALID_REQUEST, f"invalid request: {exc}") from None
        return url, events

    def _admitted(self, request: IRequest, admission: Admission, req_id: str) -> bytes:
        rt = self.runtime
        job_id = admission.job_id
        if admission.conflict:
            conflict = ApiError(
                E.INVALID_REQUEST,
                "Idempotency-Key: already used for a different request body",
            )
            return self._job_error(request, conflict, req_id)
        if job_id is None:
            rt.metrics.async_rejected.inc()
            full = ApiError(
                E.TOO_MANY_REQUESTS,
                f"async queue full (max {rt.store.max_queue})",
                {"Retry-After": rt.retry_after("async")},
            )
            return self._job_error(request, full, req_id)
        headers = {"Location": f"/jobs/{job_id}"}
        if admission.replayed:
            headers["Idempotent-Replayed"] = "true"
        else:
            rt.metrics.job_events["submitted"].inc()
            assert rt.runner is not None
            if rt.store.pull:
                rt.runner.kick()  # a free worker here takes it (or another replica's)
            else:
                rt.runner.start(job_id)
        body = {"job_id": job_id, "state": "pending", **self._job_urls(job_id)}
        return self._respond(request, 202, json_bytes(body), req_id, headers)

    def _store_errors(self, request: IRequest, answer: Maybe[bytes], req_id: str | None) -> Any:
        """A store's answer as is, or 503 when the (shared) store is unreachable."""
        if not isinstance(answer, Deferred):
            return answer

        def unavailable(failure: Any) -> bytes:
            failure.trap(StoreUnavailable)
            err = ApiError(E.NOT_READY, str(failure.value), {"Retry-After": "1"})
            return self._job_error(request, err, req_id)

        return answer.addErrback(unavailable)

    @staticmethod
    def _status_body(snap: JobSnapshot) -> bytes:
        return status_body(snap)

    def _job_lookup_error(self, request: IRequest, job_id: str) -> bytes:
        err = ApiError(E.NOT_FOUND, f"job not found: {job_id}")
        return self._job_error(request, err, self._request_id_header(request))

    def _job_get_prechecks(self, request: IRequest) -> ApiError | None:
        return self._jobs_disabled() or self._auth_error(request.requestHeaders)

    def job_status(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        rid = self._request_id_header(request)
        snap = self.runtime.store.snapshot(job_id)
        return self._store_errors(
            request,
            then(
                snap, lambda s: self._status_answer(request, job_id, self.visible(request, s), rid)
            ),
            rid,
        )

    def _status_answer(
        self, request: IRequest, job_id: str, snap: JobSnapshot | None, rid: str | None
    ) -> bytes:
        if snap is None:
            return self._job_lookup_error(request, job_id)
        return self._respond(request, 200, self._status_body(snap), rid)

    def job_wait(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        try:
            budget_ms = parse_wait_timeout(request.args.get(b"timeout", [None])[0])
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, f"invalid timeout: {exc}", status=400)
            return self._job_error(request, bad)
        rid = self._request_id_header(request)
        snap = self.runtime.store.snapshot(job_id)
        answer = then(
            snap, lambda s: self._wait_on(request, job_id, self.visible(request, s), budget_ms, rid)
        )
        return self._store_errors(request, answer, rid)

    def _wait_on(
        self, request: IRequest, job_id: str, snap: JobSnapshot | None, budget_ms: int,
        rid: str | None,
    ) -> Any:  # fmt: skip
        rt = self.runtime
        if snap is None:
            return self._job_lookup_error(request, job_id)
        if snap.terminal:
            rt.metrics.wait_wakeups.labels(reason="immediate").inc()
            return self._respond(request, 200, self._status_body(snap), rid)
        woke = within(
            rt.clock, rt.counters.counter(job_id, 1), budget_ms / 1000.0, cancel_on_expiry=True
        )
        if rt.store.shared:
            # The job may end on another replica between the read above and the
            # counter: read again now that the counter is registered (an event
            # after this point counts it), so no wake-up is lost.
            def recheck(again: JobSnapshot | None) -> None:
                if again is None or again.terminal:
                    rt.counters.count_by_name(job_id, None)

            then(rt.store.snapshot(job_id), recheck).addErrback(lambda _f: None)
        # A memory store changes state on this (the reactor) thread only, so
        # nothing can slip in between the terminal check and the counter.

        def answer(reason: str) -> Any:
            rt.metrics.wait_wakeups.labels(reason=reason).inc()
            current = rt.store.snapshot(job_id)
            return then(current, lambda c: self._status_answer(request, job_id, c, rid))

        def on_budget(failure: Any) -> Any:
            failure.trap(DeadlineExpired)
            return answer("budget")

        out: Deferred[bytes] = woke.addCallbacks(lambda _name: answer("terminal"), on_budget)
        return out

    def job_result(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)
        if err is not None:
            return self._job_error(request, err)
        rid = self._request_id_header(request)
        store = self.runtime.store

        def take(visible: bool) -> Any:
            if not visible:
                return self._job_lookup_error(request, job_id)
            lookup = store.take_result(job_id)
            return then(lookup, lambda found: self._result_answer(request, job_id, found))

        return self._store_errors(request, then(self.owns(request, job_id), take), rid)

    def _result_answer(self, request: IRequest, job_id: str, lookup: ResultLookup) -> bytes:
        if not lookup.found:
            return self._job_lookup_error(request, job_id)
        if not lookup.done:
            assert lookup.state is not None
            conflict = ApiError(
                E.JOB_NOT_FINISHED, f"job not finished (state: {lookup.state.value})"
            )
            return self._job_error(request, conflict)
        return self._respond(
            request, 200, render_success(lookup.task_id, lookup.result), lookup.task_id
        )
