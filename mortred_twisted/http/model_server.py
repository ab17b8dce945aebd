"""The model server's HTTP surface (Klein): thin routes over :class:`ModelRuntime`.

Routes (see docs/api.md): ``GET /healthz``, ``GET /ready``, ``GET /metrics``,
``GET /openapi.json`` (public); ``POST <server_uri>`` (sync inference);
``POST /jobs``, ``GET /jobs/{id}``, ``GET /jobs/{id}/wait?timeout=ms``,
``GET /jobs/{id}/result``, ``GET /jobs/{id}/files/{name}`` (async, 404 unless
``async_enabled``).

POST pre-check order: 404 → 405 → 401 → 415 → 413 (from the head, before the body is
read: :meth:`~mortred_twisted.http.request_checks.RequestChecks.refuse_from_head`) → 400 → 422 →
429. The 202 of ``POST /jobs`` is returned at admission; the job series is started
by the runner, independently of this request. ``/jobs/{id}/wait`` hangs on a named
counter raced against a reactor timer: no thread blocks, nothing polls. Every job
operation goes through the runtime's :class:`~mortred_twisted.jobs.store.JobStore`:
plain answers from the memory store, Deferreds from the shared (Redis) one, which
answers 503 "job store unavailable" while Redis cannot be reached.

The app is composed, not mixed: a :class:`~mortred_twisted.http.responder.Responder`
renders answers, :class:`~mortred_twisted.http.request_checks.RequestChecks` runs the
checks before a route, :class:`~mortred_twisted.http.job_routes.JobRoutes` holds the
job routes; this class owns the route table (Klein, declared once) and the
model-level routes (health, readiness, metrics, OpenAPI, sync inference).

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.http import errors as E
from mortred_twisted.http.envelope import render_success
from mortred_twisted.http.errors import to_api_error
from mortred_twisted.http.hot_routes import HOT_LABELS, HotRoutes
from mortred_twisted.http.job_files import INLINE_APPLIED, JobFileRoutes, inline_applied
from mortred_twisted.http.job_routes import JobRoutes
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.http.protocols.oip_routes import OipRoutes
from mortred_twisted.http.protocols.openai_routes import OpenAIImagesRoutes
from mortred_twisted.http.protocols.replicate_routes import ReplicateRoutes
from mortred_twisted.http.request_checks import RequestChecks
from mortred_twisted.http.responder import Responder, json_bytes
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.runtime.inference import QueueFull
from mortred_twisted.runtime.model_runtime import ModelRuntime
from mortred_twisted.sdk.seed_contract import sdk_declaration
from mortred_twisted.supervisor.child_contract import (
    CHALLENGE_HEADER,
    PROOF_HEADER,
    answer_challenge,
)

log = Logger()


class ModelServerApp:
    """The routes of one model server, served by :class:`~mortred_twisted.http.
    model_port.ModelPortFactory` (see the module docstring)."""

    def __init__(
        self,
        runtime: ModelRuntime,
        *,
        rate_limiter: RateLimiter | None = None,
        spawn_key: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.config = runtime.config
        #: the supervisor's per-spawn secret: ``/ready`` proves the process holds it
        #: (:mod:`~mortred_twisted.supervisor.child_contract`); None when unsupervised
        self.spawn_key = spawn_key
        self._openapi_bytes: bytes | None = None
        self.app = Klein()
        self.responder = Responder()
        self.checks = RequestChecks(runtime, self.responder, self.app, rate_limiter)
        self.jobs = JobRoutes(runtime, self.responder, self.checks)
        jobs = self.jobs
        self.files = JobFileRoutes(runtime, self.responder, jobs.job_get_prechecks, jobs.visible)
        route = self.app.route
        self._routes: dict[str, tuple[str, ...]] = {}
        #: route label -> the instrumented handler Klein registered for it
        self.handlers: dict[str, Callable] = {}

        def add(path: str, methods: tuple[str, ...], label: str, handler: Callable) -> None:
            self._routes[path] = self._routes.get(path, ()) + methods
            endpoint = self.checks.instrumented(label, handler)
            self.handlers[label] = endpoint
            route(path, methods=list(methods), strict_slashes=False)(endpoint)

        add("/healthz", ("GET",), "healthz", self.healthz)
        add("/ready", ("GET",), "ready", self.ready)
        add("/metrics", ("GET",), "metrics", self.metrics)
        add("/openapi.json", ("GET",), "openapi", self.openapi)
        add(self.config.server_uri, ("POST",), "infer", self.infer)
        add("/jobs", ("POST",), "jobs_submit", jobs.submit_job)
        add("/jobs/<job_id>", ("GET",), "jobs_status", jobs.job_status)
        add("/jobs/<job_id>/wait", ("GET",), "jobs_wait", jobs.job_wait)
        add("/jobs/<job_id>/result", ("GET",), "jobs_result", jobs.job_result)
        add("/jobs", ("GET",), "jobs_list", jobs.listing.list_jobs)
        add("/jobs/<job_id>", ("DELETE",), "jobs_cancel", jobs.cancel_job)
        add("/jobs/<job_id>/events", ("GET",), "jobs_events", jobs.events.job_events)
        add("/jobs/<job_id>/files/<name>", ("GET",), "jobs_file", self.files.job_file)
        add("/queue", ("GET",), "queue", jobs.queue)
        # Front doors onto the same jobs (docs/protocols.md)
        self.openai = OpenAIImagesRoutes(jobs)
        add("/v1/images/generations", ("POST",), "openai_images", self.openai.generations)
        add("/v1/images/edits", ("POST",), "openai_edits", self.openai.edits)
        add("/v1/models", ("GET",), "openai_models", self.openai.models)
        self.replicate = ReplicateRoutes(jobs)
        rep = self.replicate
        add("/v1/predictions", ("POST",), "replicate_create", rep.create)
        add("/v1/predictions/<prediction_id>", ("GET",), "replicate_get", rep.get)
        add("/v1/predictions/<prediction_id>/cancel", ("POST",), "replicate_cancel", rep.cancel)
        add("/v1/models/<owner>/<model_name>", ("GET",), "replicate_model", rep.model)
        add(
            "/v1/models/<owner>/<model_name>/predictions", ("POST",), "replicate_model_create",
            rep.create_for_model,
        )  # fmt: skip
        add(
            "/v1/models/<owner>/<model_name>/versions/<version>", ("GET",), "replicate_version",
            rep.version,
        )  # fmt: skip
        self.oip = OipRoutes(jobs)
        add("/v2/health/live", ("GET",), "oip_live", self.oip.live)
        add("/v2/health/ready", ("GET",), "oip_ready", self.oip.ready)
        add("/v2", ("GET",), "oip_server", self.oip.server)
        add("/v2/models/<model>", ("GET",), "oip_model", self.oip.model)
        add("/v2/models/<model>/ready", ("GET",), "oip_model_ready", self.oip.model_ready)
        add("/v2/models/<model>/infer", ("POST",), "oip_infer", self.oip.infer)
        self.checks.known_route = self.hot_routes().serves
        self.app.handle_errors(MethodNotAllowed)(self.checks.method_not_allowed)
        self.app.handle_errors(NotFound)(self.checks.not_found)

    def hot_routes(self) -> HotRoutes:
        """The hand matcher of the hot routes, over the handlers registered above."""
        return HotRoutes(
            self.config.server_uri.encode("utf-8"),
            {label: self.handlers[label] for label in HOT_LABELS},
        )

    @property
    def record_request(self) -> Callable[[IRequest], None]:
        """Count a finished request (the port's per-request hook; the checks' own
        method, so a request costs no extra call)."""
        return self.checks.record_request

    @property
    def routes(self) -> dict[str, tuple[str, ...]]:
        """Registered path templates (Klein syntax) -> methods; for the OpenAPI test."""
        return dict(self._routes)

    # -- public endpoints -------------------------------------------------------------

    def healthz(self, request: IRequest) -> bytes:
        """Liveness: 200 while the process serves. A model that failed to load says
        why (``model``/``error``): the process lives, it is not ready (``/ready``)."""
        rt = self.runtime
        if rt.load_error is None:
            return self.responder.respond(request, 200, b'{"status":"ok"}')
        doc = {"status": "ok", "model": rt.readiness.value, "error": rt.load_error}
        return self.responder.respond(request, 200, json_bytes(doc))

    def ready(self, request: IRequest) -> bytes:
        if self.spawn_key is not None:  # the supervisor's challenge: prove who we are
            answer = answer_challenge(self.spawn_key, request.getHeader(CHALLENGE_HEADER))
            if answer is not None:
                request.setHeader(PROOF_HEADER, answer)
        rt = self.runtime
        doc: dict[str, Any] = {
            "ready": rt.ready,
            "state": rt.readiness.value,
            "model": self.config.model_type,
            "id": self.config.id,
        }
        if rt.ready:
            return self.responder.respond(request, 200, json_bytes(doc))
        err = self.checks.not_ready()
        doc.update({"code": err.code, "error": err.message})
        return self.responder.respond(request, 503, json_bytes(doc))

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
            declaration = sdk_declaration(model)  # the seed envelope: by its params
            self._openapi_bytes = json_bytes(
                build_openapi(self.config, schema, output, declaration)
            )
        return self.responder.respond(request, 200, self._openapi_bytes)

    # -- sync inference ---------------------------------------------------------------

    def infer(self, request: IRequest) -> Any:
        req_id = self.responder.request_id(request)
        err = self.checks.post_prechecks(request)
        if err is not None:
            return self.responder.envelope_error(request, err, req_id)
        try:
            valid, req_id = self.checks.parse_and_validate(request)
            err = self.checks.rate_limited(request)
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
            return self.responder.envelope_error(request, full, req_id)
        except Exception as exc:
            # The envelope's req_id once it parsed (a validation error names it too).
            req_id = self.responder.request_id(request)
            return self.responder.envelope_error(request, to_api_error(exc), req_id)

        applied = inline_applied(self.runtime, self.responder.header(request, b"prefer"))

        def ok(result: Any) -> bytes:
            headers = {"Server-Timing": f"model;dur={result.run_ms:.3f}"}
            if applied:  # the sync path is always inline: say so when asked
                headers[INLINE_APPLIED[0]] = INLINE_APPLIED[1]
            return self.responder.respond(
                request, 200, render_success(req_id, result.data_json), req_id, headers
            )

        def failed(failure: Any) -> bytes:
            api = to_api_error(failure.value)
            if api.code == E.INTERNAL_ERROR:
                log.failure("sync inference failed", failure)
            return self.responder.envelope_error(request, api, req_id)

        return work.addCallbacks(ok, failed)

    # -- async jobs -------------------------------------------------------------------
