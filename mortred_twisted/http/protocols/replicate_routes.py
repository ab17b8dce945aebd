"""Replicate's predictions API on a model port (edge, reactor thread only).

``POST /v1/predictions``, ``POST /v1/models/{owner}/{name}/predictions``, ``GET
/v1/predictions/{id}``, ``POST /v1/predictions/{id}/cancel``, ``GET
/v1/models/{owner}/{name}`` and ``GET /v1/models/{owner}/{name}/versions/{v}``
(:mod:`~mortred_twisted.http.protocols.replicate` maps the objects). A create builds
a :class:`~mortred_twisted.http.protocols.submission.Submission` (``input`` as the
model's params, ``webhook`` and ``webhook_events_filter`` as the native job's) and is
admitted through :meth:`JobRoutes.admit`; ``Prefer: wait[=n]`` holds the answer up
to ``n`` s (at most 60) and then answers the prediction as it is (the client polls
on). A prediction is its caller's only: another caller's id is a 404, as on the job
routes. Errors are Replicate's ``{"title", "detail", "status"}``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.fair_share import check_priority
from mortred_twisted.http.protocols.door import Door, read_json_body
from mortred_twisted.http.protocols.openai_images import public_base
from mortred_twisted.http.protocols.replicate import (
    ReplicateError,
    check_model,
    model_object,
    parse_create,
    parse_wait,
    prediction,
    version_object,
)
from mortred_twisted.http.protocols.submission import Answer, Submission
from mortred_twisted.http.responder import json_bytes
from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, submission_fingerprint
from mortred_twisted.jobs.store import then
from mortred_twisted.jobs.types import Admission, JobSnapshot
from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest
from mortred_twisted.runtime.deadline import DeadlineExpired, within


def replicate_error(err: ApiError) -> ReplicateError:
    cause = err.__cause__
    if isinstance(cause, InvalidRequest):
        name = cause.field.removeprefix("params.")
        return ReplicateError(422, f"input.{name}: {cause.message}")
    return ReplicateError(err.http_status, err.message, "Error")


class ReplicateRoutes(Door):
    """The Replicate door of one model server (see the module docstring)."""

    def __init__(self, jobs: Any) -> None:
        super().__init__(jobs)
        self.started = time.time()

    def error(self, request: IRequest, err: ReplicateError, headers: Any = None) -> bytes:
        return self.responder.respond(request, err.status, json_bytes(err.body()), None, headers)

    def _base(self, request: IRequest) -> str:
        return public_base(request.requestHeaders.getRawHeaders(b"host", [None])[0])

    def _gate(self, request: IRequest) -> None:
        err = self.jobs.job_get_prechecks(request)
        if err is not None:
            raise replicate_error(err)

    # -- models -------------------------------------------------------------------

    def model(self, request: IRequest, owner: str, model_name: str) -> bytes:
        try:
            self._gate(request)
            check_model(owner, model_name, self.config.id)
        except ReplicateError as exc:
            return self.error(request, exc)
        description = f"{self.config.model_type} model"
        doc = model_object(self.config.id, description, self._base(request), self.started)
        return self.responder.respond(request, 200, json_bytes(doc))

    def version(self, request: IRequest, owner: str, model_name: str, version: str) -> bytes:
        try:
            self._gate(request)
            check_model(owner, model_name, self.config.id)
            if version != self.config.id:
                raise ReplicateError(404, f"version {version[:100]} not found", "Not found")
        except ReplicateError as exc:
            return self.error(request, exc)
        doc = version_object(self.config.id, self.started)
        return self.responder.respond(request, 200, json_bytes(doc))

    # -- create -------------------------------------------------------------------

    def create_for_model(self, request: IRequest, owner: str, model_name: str) -> Any:
        try:
            check_model(owner, model_name, self.config.id)
        except ReplicateError as exc:
            return self.error(request, exc)
        return self.create(request)

    def create(self, request: IRequest) -> Any:
        jobs = self.jobs
        head = self.responder.head(request)
        try:
            err = jobs.jobs_disabled() or self.checks.post_prechecks(request, head)
            if err is not None:
                raise replicate_error(err)
            doc = read_json_body(request, head.content_type, ReplicateError)
            inputs, fields = parse_create(doc, self.config.id)
            wait_s = parse_wait(head.prefer)
            submission = self._submission(request, head, inputs, fields)
        except ReplicateError as exc:
            return self.error(request, exc)
        except BadIdempotencyKey as exc:
            return self.error(request, ReplicateError(400, str(exc)))
        except ApiError as exc:
            return self.error(request, replicate_error(exc), exc.headers)
        return jobs.admit(
            request, submission, lambda a: self._admitted(request, submission, inputs, wait_s, a)
        )

    def _submission(
        self, request: IRequest, head: Any, inputs: dict[str, Any], fields: dict[str, Any]
    ) -> Submission:
        jobs = self.jobs
        key = check_key(head.idempotency_key)
        req_id = self.responder.request_id(request, head)
        parsed = InferenceRequest(req_id=req_id, images=(), params=dict(inputs))
        valid = self.checks.validate(parsed)
        webhook = jobs._webhook_target(fields)
        owner, _ = jobs.principal(request, head)
        terms = jobs.terms(request, head)
        priority = check_priority({}, terms)
        err = self.checks.rate_limited(request)
        if err is not None:
            raise err
        fp = ""
        if key is not None:
            fp = submission_fingerprint((), inputs, {"door": "replicate", **fields})
        return Submission(
            self.config.id, valid, req_id, owner, key, fp, priority, terms, webhook, False,
            Answer.ASYNC,
        )  # fmt: skip

    def _admitted(
        self, request: IRequest, submission: Submission, inputs: dict[str, Any],
        wait_s: int | None, admission: Admission,
    ) -> Any:  # fmt: skip
        refused = self.jobs.begin(admission, submission.caller)
        if refused is not None:
            return self.error(request, replicate_error(refused), refused.headers)
        job_id = admission.job_id
        assert job_id is not None
        if not wait_s:
            return self._answer(request, job_id, 201, inputs)
        rt = self.runtime
        woke = within(rt.clock, rt.counters.counter(job_id, 1), wait_s, cancel_on_expiry=True)
        then(rt.store.snapshot(job_id), lambda s: self._ended(job_id, s))

        def answer(_: Any) -> Any:
            return self._answer(request, job_id, 201, inputs)

        def budget(failure: Any) -> Any:
            failure.trap(DeadlineExpired)
            return self._answer(request, job_id, 201, inputs)

        return woke.addCallbacks(answer, budget)

    def _ended(self, job_id: str, snap: JobSnapshot | None) -> None:
        if snap is not None and snap.terminal:
            self.runtime.counters.count_by_name(job_id, None)

    # -- read, cancel -------------------------------------------------------------

    def _answer(
        self, request: IRequest, job_id: str, status: int, inputs: dict[str, Any] | None
    ) -> Any:
        """The prediction ``job_id`` as it is now (404 when not this caller's)."""
        rt = self.runtime

        def with_snap(snap: JobSnapshot | None) -> Any:
            snap = self.jobs.visible(request, snap)
            if snap is None:
                missing = ReplicateError(404, f"prediction {job_id[:100]} not found", "Not found")
                return self.error(request, missing)
            if snap.state.value != "done":
                return self._render(request, status, snap, None, inputs)
            return then(
                rt.store.take_result(job_id),
                lambda found: self._render(
                    request, status, snap, json.loads(found.result) if found.done else None, inputs
                ),
            )

        answer = then(rt.store.snapshot(job_id), with_snap)
        return self.responder.store_errors(request, answer, None)

    def _render(
        self, request: IRequest, status: int, snap: JobSnapshot, output: Any,
        inputs: dict[str, Any] | None,
    ) -> bytes:  # fmt: skip
        doc = prediction(self.config.id, snap, output, self._base(request), inputs, time.time())
        return self.responder.respond(request, status, json_bytes(doc))

    def get(self, request: IRequest, prediction_id: str) -> Any:
        try:
            self._gate(request)
        except ReplicateError as exc:
            return self.error(request, exc)
        return self._answer(request, prediction_id, 200, None)

    def cancel(self, request: IRequest, prediction_id: str) -> Any:
        try:
            self._gate(request)
        except ReplicateError as exc:
            return self.error(request, exc)
        rt = self.runtime

        def act(visible: bool) -> Any:
            if not visible:
                missing = ReplicateError(404, f"prediction {prediction_id[:100]} not found")
                return self.error(request, missing)

            def cancelled(out: Any) -> Any:
                self.jobs.cancel_effects(prediction_id, out[0])
                return self._answer(request, prediction_id, 200, None)

            return then(rt.store.cancel(prediction_id), cancelled)

        return self.responder.store_errors(
            request, then(self.jobs.owns(request, prediction_id), act), None
        )
