"""The OpenAI images door of a model port (edge, reactor thread only).

``POST /v1/images/generations`` and ``GET /v1/models``
(:mod:`~mortred_twisted.http.protocols.openai_images` maps the bodies). The door
builds a :class:`~mortred_twisted.http.protocols.submission.Submission` and admits it
through :meth:`JobRoutes.admit <mortred_twisted.http.job_routes.JobRoutes.admit>`:
validation, admission, fair share, idempotency, jobs and result files are the native
API's. ``Prefer: respond-async`` answers 202 with the native job body; otherwise the
request is held and answered when the job ends, and a client that disconnects first
cancels its job (as the sync path does). Errors are OpenAI's error object.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.fair_share import check_priority
from mortred_twisted.http.multipart import is_multipart, parse_form
from mortred_twisted.http.protocols.door import Door, read_json_body
from mortred_twisted.http.protocols.held import hold_until_done
from mortred_twisted.http.protocols.openai_images import (
    ImagesAsk,
    OpenAIError,
    bad,
    images_answer,
    models_answer,
    param_of,
    parse_edits,
    parse_generations,
    public_base,
)
from mortred_twisted.http.protocols.submission import Answer, Submission
from mortred_twisted.http.responder import json_bytes
from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, submission_fingerprint
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.types import Admission, ResultLookup
from mortred_twisted.model_api.base import InferenceRequest, InvalidRequest

_RESPOND_ASYNC = re.compile(rb"(^|[,;\s])respond-async($|[,;\s])", re.IGNORECASE)


def openai_error(err: ApiError) -> OpenAIError:
    """A native :class:`ApiError` in OpenAI's shape (422 becomes OpenAI's 400; the
    param a model's validation names is OpenAI's)."""
    cause = err.__cause__
    if isinstance(cause, InvalidRequest):
        return bad(f"{param_of(cause.field)}: {cause.message}", param_of(cause.field))
    status = 400 if err.http_status == 422 else err.http_status
    kind = "invalid_request_error"
    code = None
    if status == 401:
        code = "invalid_api_key"
    elif status == 429:
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    elif status >= 500:
        kind = "server_error"
    return OpenAIError(status, err.message, kind=kind, code=code, headers=err.headers)


class OpenAIImagesRoutes(Door):
    """The OpenAI door of one model server (see the module docstring); composed of
    the server's :class:`~mortred_twisted.http.job_routes.JobRoutes`."""

    def __init__(self, jobs: Any) -> None:
        super().__init__(jobs)
        self.created = int(self.runtime.clock.seconds())

    def error(self, request: IRequest, err: OpenAIError, req_id: str | None = None) -> bytes:
        return self.responder.respond(
            request, err.status, json_bytes(err.body()), req_id, err.headers
        )

    def models(self, request: IRequest) -> bytes:
        """``GET /v1/models``: this port's model, in OpenAI's list shape."""
        err = self.checks.auth_error(request.requestHeaders)
        if err is not None:
            return self.error(request, openai_error(err))
        doc = models_answer([self.config.id], self.created)
        return self.responder.respond(request, 200, json_bytes(doc))

    def generations(self, request: IRequest) -> Any:
        """``POST /v1/images/generations`` (module docstring)."""
        jobs = self.jobs
        head = self.responder.head(request)
        req_id = self.responder.request_id(request, head)
        try:
            err = jobs.jobs_disabled() or self.checks.post_prechecks(request, head)
            if err is not None:
                raise openai_error(err)
            doc = read_json_body(request, head.content_type, OpenAIError)
            ask = parse_generations(doc, self.config.id)
            submission = self._submission(request, head, ask, req_id)
        except OpenAIError as exc:
            return self.error(request, exc, req_id)
        except BadIdempotencyKey as exc:
            return self.error(request, bad(str(exc), code="invalid_idempotency_key"), req_id)
        except ApiError as exc:
            return self.error(request, openai_error(exc), req_id)
        return jobs.admit(
            request, submission, lambda a: self._admitted(request, submission, ask, a)
        )

    def edits(self, request: IRequest) -> Any:
        """``POST /v1/images/edits`` (multipart: ``image``, ``mask``?, ``prompt``, …)
        for a model that takes a picture (the image-to-image and inpainting kinds;
        another answers a 400 on ``image``, from its declaration)."""
        jobs = self.jobs
        head = self.responder.head(request)
        req_id = self.responder.request_id(request, head)
        try:
            err = jobs.jobs_disabled() or self.checks.post_prechecks(request, head)
            if err is not None:
                raise openai_error(err)
            ctype = head.content_type
            if ctype is None or not is_multipart(ctype.decode("latin-1")):
                raise OpenAIError(415, "content type must be multipart/form-data")
            form = parse_form(request.content.read(), ctype.decode("latin-1"))
            ask, text = parse_edits(form.fields, form.files, self.config.id)
            submission = self._submission(request, head, ask, req_id, text)
        except OpenAIError as exc:
            return self.error(request, exc, req_id)
        except BadIdempotencyKey as exc:
            return self.error(request, bad(str(exc), code="invalid_idempotency_key"), req_id)
        except ApiError as exc:
            return self.error(request, openai_error(exc), req_id)
        return jobs.admit(
            request, submission, lambda a: self._admitted(request, submission, ask, a)
        )

    def _submission(
        self, request: IRequest, head: Any, ask: ImagesAsk, req_id: str, text: bool = False
    ) -> Submission:
        jobs = self.jobs
        key = check_key(head.idempotency_key)
        parsed = InferenceRequest(
            req_id=req_id, images=(), params=dict(ask.params), text_params=text
        )
        valid = self.checks.validate(parsed)
        inline = ask.response_format == "b64_json"
        if inline:
            valid = replace(valid, inline_files=True)
        owner, _ = jobs.principal(request, head)
        terms = jobs.terms(request, head)
        priority = check_priority({}, terms)
        err = self.checks.rate_limited(request)
        if err is not None:
            raise err
        fp = ""
        if key is not None:
            extras = {"door": "openai", "response_format": ask.response_format}
            fp = submission_fingerprint((), ask.params, extras)
        prefer = head.prefer
        mode = (
            Answer.ASYNC
            if prefer is not None and _RESPOND_ASYNC.search(prefer)
            else Answer.WHEN_DONE
        )
        return Submission(
            self.config.id, valid, req_id, owner, key, fp, priority, terms, None, inline, mode
        )

    def _admitted(
        self, request: IRequest, submission: Submission, ask: ImagesAsk, admission: Admission
    ) -> Any:
        refused = self.jobs.begin(admission, submission.caller)
        req_id = submission.request_id
        if refused is not None:
            return self.error(request, openai_error(refused), req_id)
        job_id = admission.job_id
        assert job_id is not None
        headers = {"Location": f"/jobs/{job_id}"}
        if admission.replayed:
            headers["Idempotent-Replayed"] = "true"
        if submission.answer is Answer.ASYNC:
            headers["Preference-Applied"] = "respond-async"
            body = {"job_id": job_id, "state": "pending", **self.jobs._job_urls(job_id)}
            return self.responder.respond(request, 202, json_bytes(body), req_id, headers)
        return self._when_done(request, job_id, ask, req_id, headers)

    def _when_done(
        self, request: IRequest, job_id: str, ask: ImagesAsk, req_id: str,
        headers: dict[str, str],
    ) -> Any:  # fmt: skip
        """Hold the request until the job ends, then answer its pictures; a client
        that leaves first cancels the job (:func:`hold_until_done`)."""
        return hold_until_done(
            self.jobs, job_id, lambda found: self._answer(request, found, ask, req_id, headers)
        )

    def _answer(
        self, request: IRequest, lookup: ResultLookup, ask: ImagesAsk, req_id: str,
        headers: dict[str, str],
    ) -> bytes:  # fmt: skip
        if not lookup.found:
            gone = OpenAIError(500, "the job is gone (retention)", kind="server_error")
            return self.error(request, gone, req_id)
        if not lookup.done:
            state = lookup.state
            status = 504 if state is JobState.TIMEOUT else 500
            message = f"the image job ended {state.value if state else 'without a result'}"
            return self.error(request, OpenAIError(status, message, kind="server_error"), req_id)
        data = json.loads(lookup.result)
        doc = images_answer(data, ask.response_format, self._base_url(request))
        return self.responder.respond(request, 200, json_bytes(doc), req_id, headers)

    @staticmethod
    def _base_url(request: IRequest) -> str:
        """``http://<Host>`` for a well-formed ``Host``, else "" (relative URLs)."""
        return public_base(request.requestHeaders.getRawHeaders(b"host", [None])[0])
