"""The Open Inference Protocol v2 door of a model port (edge, reactor thread only).

``GET /v2/health/live``, ``/v2/health/ready``, ``/v2``, ``/v2/models/{m}``,
``/v2/models/{m}/ready`` and ``POST /v2/models/{m}/infer``
(:mod:`~mortred_twisted.http.protocols.oip` maps the tensors). An infer builds a
:class:`~mortred_twisted.http.protocols.submission.Submission` and is admitted
through :meth:`JobRoutes.admit <mortred_twisted.http.job_routes.JobRoutes.admit>`;
the request is held until the job ends (the protocol has no async mode) and a
client that disconnects cancels the job (:func:`~.held.hold_until_done`). The
health routes are public like ``/healthz``; the model routes take the port's bearer.
Errors are ``{"error": "..."}`` with the protocol's status codes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted import __version__
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.fair_share import check_priority
from mortred_twisted.http.protocols.door import Door
from mortred_twisted.http.protocols.held import hold_until_done
from mortred_twisted.http.protocols.oip import (
    InferAsk,
    OipError,
    infer_answer,
    model_metadata,
    parse_infer,
    split_body,
)
from mortred_twisted.http.protocols.submission import Answer, Submission
from mortred_twisted.http.responder import json_bytes
from mortred_twisted.http11.auth import WWW_AUTHENTICATE
from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, submission_fingerprint
from mortred_twisted.jobs.types import Admission, ResultLookup
from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest
from mortred_twisted.sdk.seed_contract import sdk_declaration
from mortred_twisted.sdk.validation import Upload

HEADER_LENGTH = b"inference-header-content-length"


def oip_error(err: ApiError) -> OipError:
    """A native :class:`ApiError` as the protocol's error (422 becomes 400; a model
    validation error names the input)."""
    cause = err.__cause__
    if isinstance(cause, InvalidRequest):
        return OipError(f"input {cause.field.removeprefix('params.')}: {cause.message}")
    return OipError(err.message, 400 if err.http_status == 422 else err.http_status)


class OipRoutes(Door):
    """The OIP door of one model server (see the module docstring)."""

    def _json(self, request: IRequest, status: int, doc: Any) -> bytes:
        return self.responder.respond(request, status, json_bytes(doc))

    def error(self, request: IRequest, err: OipError, headers: Any = None) -> bytes:
        return self.responder.respond(
            request, err.status, json_bytes({"error": err.message}), None, headers
        )

    # -- health and metadata ------------------------------------------------------

    def live(self, request: IRequest) -> bytes:
        return self._json(request, 200, {"live": True})

    def ready(self, request: IRequest) -> bytes:
        ready = self.runtime.ready
        return self._json(request, 200 if ready else 503, {"ready": ready})

    def server(self, request: IRequest) -> bytes:
        doc = {"name": "mortred-twisted", "version": __version__,
               "extensions": ["binary_tensor_data"]}  # fmt: skip
        return self._json(request, 200, doc)

    def _declaration(self, request: IRequest, model: str) -> Any:
        """The model's declaration, or raises :class:`OipError` (401, 404, 503, 400)."""
        err = self.checks.auth_error(request.requestHeaders)
        if err is not None:
            raise OipError(err.message, 401)
        if model != self.config.id:
            raise OipError(f"unknown model: {model[:200]} (this port serves {self.config.id})", 404)
        if not self.runtime.ready:
            raise OipError(self.checks.not_ready().message, 503)
        declaration = sdk_declaration(self.runtime.validator)
        if declaration is None:
            raise OipError(f"{model}: not declared with the SDK: no tensors to describe", 400)
        return declaration

    def model(self, request: IRequest, model: str) -> bytes:
        try:
            declaration = self._declaration(request, model)
        except OipError as exc:
            return self.error(request, exc, _auth_headers(exc))
        return self._json(request, 200, model_metadata(self.config.id, declaration))

    def model_ready(self, request: IRequest, model: str) -> bytes:
        try:
            self._declaration(request, model)
        except OipError as exc:
            return self.error(request, exc, _auth_headers(exc))
        return self._json(request, 200, {"name": model, "ready": True})

    # -- infer --------------------------------------------------------------------

    def infer(self, request: IRequest, model: str) -> Any:
        jobs = self.jobs
        head = self.responder.head(request)
        try:
            if jobs.jobs_disabled() is not None:
                raise OipError("this server runs no jobs (async_enabled = false)", 404)
            declaration = self._declaration(request, model)
            content = request.content
            size = content.seek(0, 2)
            content.seek(0)
            if size > self.config.request_size_limit_bytes:
                raise OipError(self.checks.too_large().message, 413)
            length = request.requestHeaders.getRawHeaders(HEADER_LENGTH, [None])[0]
            doc, rest = split_body(content.read(), length)
            ask = parse_infer(doc, rest, declaration)
            submission = self._submission(request, head, ask)
        except OipError as exc:
            return self.error(request, exc, _auth_headers(exc))
        except BadIdempotencyKey as exc:
            return self.error(request, OipError(str(exc)))
        except ApiError as exc:
            return self.error(request, oip_error(exc), exc.headers)
        return jobs.admit(
            request, submission, lambda a: self._admitted(request, submission, ask, a)
        )

    def _submission(self, request: IRequest, head: Any, ask: InferAsk) -> Submission:
        jobs = self.jobs
        key = check_key(head.idempotency_key)
        req_id = ask.request_id or self.responder.request_id(request, head)
        params: dict[str, Any] = dict(ask.params)
        for name, values in ask.files.items():
            uploads = [Upload(data=v, content_type=None, filename=None) for v in values]
            params[name] = uploads if len(uploads) != 1 or self._is_list(name) else uploads[0]
        parsed = InferenceRequest(req_id=req_id, images=(), params=params)
        valid = self.checks.validate(parsed)
        valid = replace(valid, inline_files=True)  # outputs travel in the answer
        owner, _ = jobs.principal(request, head)
        terms = jobs.terms(request, head)
        priority = check_priority({}, terms)
        err = self.checks.rate_limited(request)
        if err is not None:
            raise err
        fp = ""
        if key is not None:
            fp = submission_fingerprint((), params, {"door": "oip"})
        return Submission(
            self.config.id, valid, req_id, owner, key, fp, priority, terms, None, True,
            Answer.WHEN_DONE,
        )  # fmt: skip

    def _is_list(self, name: str) -> bool:
        decl = sdk_declaration(self.runtime.validator)
        entry = decl.input(name) if decl is not None else None
        return bool(entry is not None and entry.is_list)

    def _admitted(
        self, request: IRequest, submission: Submission, ask: InferAsk, admission: Admission
    ) -> Any:
        refused = self.jobs.begin(admission, submission.caller)
        if refused is not None:
            return self.error(request, oip_error(refused), refused.headers)
        job_id = admission.job_id
        assert job_id is not None
        return hold_until_done(
            self.jobs, job_id, lambda found: self._answer(request, submission, ask, found)
        )

    def _answer(
        self, request: IRequest, submission: Submission, ask: InferAsk, lookup: ResultLookup
    ) -> bytes:
        if not lookup.found or not lookup.done:
            state = lookup.state.value if lookup.state is not None else "gone"
            return self.error(request, OipError(f"inference ended {state}", 500))
        try:
            declaration = sdk_declaration(self.runtime.validator)
            output = declaration.output if declaration is not None else None
            by_field = output is not None and output.kind == "object" and not output.is_list
            body, head_length = infer_answer(
                self.config.id, ask.request_id, json.loads(lookup.result), ask, by_field
            )
        except OipError as exc:
            return self.error(request, exc)
        headers: dict[str, str] = {}
        if head_length is not None:
            headers["Inference-Header-Content-Length"] = str(head_length)
            request.setHeader(b"Content-Type", b"application/octet-stream")
            request.setResponseCode(200)
            request.setHeader(b"Content-Length", str(len(body)).encode())
            for name, value in headers.items():
                request.setHeader(name.encode(), value.encode())
            return body
        return self.responder.respond(request, 200, body, submission.request_id, headers)


def _auth_headers(exc: OipError) -> dict[str, str] | None:
    return {"WWW-Authenticate": WWW_AUTHENTICATE} if exc.status == 401 else None
