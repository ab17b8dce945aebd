"""The job routes of a model port: submit, status, wait, result, cancel, and whose job
is whose; the listing (:mod:`~mortred_twisted.http.job_listing`) and live events
(:mod:`~mortred_twisted.http.job_stream`) are composed in.

Routes (docs/api.md § "Beyond the seed"): ``DELETE /jobs/{id}`` (cancel),
``GET /jobs?state=&limit=&cursor=`` (listing, newest first), ``GET
/jobs/{id}/events`` (server-sent events). Composed into
:class:`~mortred_twisted.http.model_server.ModelServerApp` from the runtime, a
:class:`~mortred_twisted.http.responder.Responder` and the
:class:`~mortred_twisted.http.request_checks.RequestChecks`; thin: check, one call
into the store/runner, render.

**Callers.** A job belongs to the *principal* that submitted it. On a model port the
principal is ``X-Mortred-Principal`` when the server has an ``auth_token`` (every
request that reached a route then carried it: the gateway, which names the API key
it authenticated), else the port itself (``""``). ``X-Mortred-Principal-Scope:
all`` (same condition) lets a caller list every job. Without a principal header the
port's own token holder sees every job. Idempotency keys are scoped per principal.
Every job route answers another principal's job exactly as an unknown id (404):
status, wait, result, events and cancel (which leaves that job alone).

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.envelope import render_success
from mortred_twisted.http.errors import ApiError, to_api_error
from mortred_twisted.http.fair_share import caller_terms, check_priority, over_quota, queue_body
from mortred_twisted.http.job_files import INLINE_APPLIED, prefers_inline
from mortred_twisted.http.job_listing import JobListing
from mortred_twisted.http.job_stream import JobEventStream
from mortred_twisted.http.protocols.submission import RequestHead, Submission
from mortred_twisted.http.request_checks import RequestChecks
from mortred_twisted.http.responder import Responder, json_bytes
from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, submission_fingerprint
from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.status import status_body
from mortred_twisted.jobs.store import then
from mortred_twisted.jobs.types import Admission, JobSnapshot, ResultLookup
from mortred_twisted.jobs.webhooks import WebhookRejected, check_target, parse_events_filter
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.model_runtime import Readiness
from mortred_twisted.sdk.seed_contract import sdk_declaration

PRINCIPAL_HEADER = b"X-Mortred-Principal"
PRINCIPAL_SCOPE_HEADER = b"X-Mortred-Principal-Scope"
MAX_PRINCIPAL_LENGTH = 128
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


def no_result_message(state: JobState) -> str:
    """The 409 message of ``/result`` for a job in ``state`` (not ``done``): a
    cancelled job says it was cancelled (it never will have a result); the others
    name their state (docs/api.md)."""
    if state is JobState.CANCELLED:
        return "job was cancelled (state: cancelled): it has no result"
    return f"job not finished (state: {state.value})"


class JobRoutes:
    """The job routes of one model server (see the module docstring)."""

    def __init__(self, runtime: Any, responder: Responder, checks: RequestChecks) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self.responder = responder
        self.checks = checks
        self.listing = JobListing(runtime, responder, self.job_get_prechecks, self.principal)
        self.events = JobEventStream(runtime, responder, self.job_get_prechecks, self.visible)

    # -- who is asking ------------------------------------------------------------

    def principal(self, request: IRequest, head: RequestHead | None = None) -> tuple[str, bool]:
        """``(owner, sees_every_job)`` of this request (see the module docstring);
        ``head``: its :class:`RequestHead` when the caller holds it."""
        if self.checks.token is None:
            return "", True
        if head is None:
            head = self.responder.head(request)
        raw = head.principal
        if not raw:
            return "", True
        name = raw.decode("utf-8", "replace").strip()[:MAX_PRINCIPAL_LENGTH]
        scope = head.principal_scope or b""
        return name, scope.strip().lower() == b"all"

    def visible(self, request: IRequest, snap: JobSnapshot | None) -> JobSnapshot | None:
        """``snap`` if this request's caller may see that job, else None: another
        caller's job is answered exactly as an unknown id (404), so ids cannot be
        probed. Callers with the ``all`` scope (and the port's own token holder)
        see every job."""
        if snap is None:
            return None
        owner, sees_all = self.principal(request)
        return snap if sees_all or snap.owner == owner else None

    def owns(self, request: IRequest, job_id: str) -> Any:
        """Whether this request's caller may act on ``job_id`` (a bool, or a Deferred
        of one on a shared store); True without a read for callers that see all."""
        _, sees_all = self.principal(request)
        if sees_all:
            return True
        return then(
            self.runtime.store.snapshot(job_id), lambda s: self.visible(request, s) is not None
        )

    def terms(self, request: IRequest, head: RequestHead | None = None) -> Any:
        """The caller's :class:`~mortred_twisted.jobs.fair_queue.CallerTerms`
        (weight, own limit, highest priority; ``http/fair_share.py``)."""
        raw = (head or self.responder.head(request)).principal
        return caller_terms(request, trusted=self.checks.token is not None, has_principal=bool(raw))

    # -- queue --------------------------------------------------------------------

    def queue(self, request: IRequest) -> Any:
        """``GET /queue``: the model's queue, per caller for a caller that sees every
        job, else its own line only."""
        err = self.job_get_prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        view = getattr(self.runtime.store, "queue_view", None)
        if view is None:
            missing = ApiError(E.NOT_FOUND, "this job store does not show its queue yet")
            return self.responder.job_error(request, missing, rid)
        owner, sees_all = self.principal(request)
        answer = then(
            view(None if sees_all else owner),
            lambda v: self.responder.respond(request, 200, queue_body(v), rid),
        )
        return self.responder.store_errors(request, answer, rid)

    # -- cancel -------------------------------------------------------------------

    def cancel_job(self, request: IRequest, job_id: str) -> Any:
        err = self.job_get_prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)

        def cancel(visible: bool) -> Any:
            if not visible:  # another caller's job: as unknown, and left alone
                return self.responder.lookup_error(request, job_id)
            return then(
                self.runtime.store.cancel(job_id),
                lambda out: self._cancelled(request, job_id, *out, rid),
            )

        answer = then(self.owns(request, job_id), cancel)
        return self.responder.store_errors(request, answer, rid)

    def _cancelled(
        self,
        request: IRequest,
        job_id: str,
        outcome: CancelOutcome,
        snap: JobSnapshot | None,
        rid: str | None,
    ) -> bytes:
        if outcome is CancelOutcome.UNKNOWN or snap is None:
            return self.responder.lookup_error(request, job_id)
        if outcome is CancelOutcome.FINISHED:
            conflict = ApiError(
                E.JOB_NOT_FINISHED, f"job already finished (state: {snap.state.value})"
            )
            return self.responder.job_error(request, conflict, rid)
        self.cancel_effects(job_id, outcome)
        if outcome is CancelOutcome.CANCELLED:
            return self.responder.respond(request, 200, status_body(snap), rid)
        return self.responder.respond(request, 202, status_body(snap), rid)

    def cancel_effects(self, job_id: str, outcome: CancelOutcome) -> None:
        """What an accepted cancel does beyond the store (any door): the runner stops
        a running job; a pending job that ended here is counted and its waiters woken
        (what the runner's terminal step does)."""
        if outcome is CancelOutcome.UNKNOWN or outcome is CancelOutcome.FINISHED:
            return
        rt = self.runtime
        if rt.runner is not None:
            rt.runner.cancel(job_id)
        if outcome is CancelOutcome.CANCELLED:
            rt.metrics.job_events["cancelled"].inc()
            rt.counters.count_by_name(job_id, None)
            rt.events.ended(job_id)

    # -- submit, status, wait, result ----------------------------------------------

    def jobs_disabled(self) -> ApiError | None:
        if self.config.async_enabled:
            return None
        return ApiError(E.NOT_FOUND, "async jobs are not enabled on this server")

    def _job_urls(self, job_id: str) -> dict[str, str]:
        return {"poll_url": f"/jobs/{job_id}", "result_url": f"/jobs/{job_id}/result"}

    def submit_job(self, request: IRequest) -> Any:
        """``POST /jobs``: the native door. Builds the :class:`Submission` and admits it."""
        head = self.responder.head(request)  # every header of a submit, read once
        req_id = self.responder.request_id(request, head)
        err = self.jobs_disabled() or self.checks.post_prechecks(request, head)
        if err is not None:
            return self.responder.job_error(request, err, req_id)
        try:
            submission = self.native_submission(request, head)
        except BadIdempotencyKey as exc:
            bad = ApiError(E.INVALID_REQUEST, str(exc), status=400)
            return self.responder.job_error(request, bad)
        except Exception as exc:
            return self.responder.job_error(
                request, to_api_error(exc), self.responder.request_id(request, head)
            )
        return self.admit(request, submission)

    def native_submission(self, request: IRequest, head: RequestHead) -> Submission:
        """The native API's :class:`Submission` (400 → 503 → 422 → 429 as
        :class:`ApiError`, a bad key as :class:`BadIdempotencyKey`): the envelope,
        parsed and validated, with what its head asks for, each header read once."""
        key = check_key(head.idempotency_key)
        job_fields: dict[str, Any] = {}
        parsed = self.checks.parse(request, job_fields, head)
        valid = self.checks.validate(parsed)
        inline = prefers_inline(head.prefer)
        if inline:
            valid = replace(valid, inline_files=True)  # result files as base64
        webhook = self._webhook_target(job_fields)
        owner, _ = self.principal(request, head)
        terms = self.terms(request, head)
        priority = check_priority(job_fields, terms)
        err = self.checks.rate_limited(request)
        if err is not None:
            raise err
        fp = ""
        if key is not None:
            # The preference is part of "the same request": a replay that reports
            # Preference-Applied had it at admission too.
            extras = {**job_fields, "inline": inline, "text_params": parsed.text_params}
            fp = submission_fingerprint(parsed.images, parsed.params, extras)
        return Submission(
            self.config.id, valid, parsed.req_id, owner, key, fp, priority, terms, webhook,
            inline,
        )  # fmt: skip

    def admit(
        self,
        request: IRequest,
        submission: Submission,
        answer: Callable[[Admission], Any] | None = None,
    ) -> Any:
        """Admit ``submission`` and answer the native way (202 with the job, or the
        refusal), or with ``answer`` (another door: it calls :meth:`begin`); the
        store's answer may be a Deferred."""
        rt = self.runtime
        # A fair store places the job by the caller's terms and band (the Redis
        # store takes neither yet: its jobs start first in, first out).
        fair = (
            {"terms": submission.terms, "priority": submission.priority}
            if getattr(rt.store, "fair", False)
            else {}
        )
        req_id, owner = submission.request_id, submission.caller
        admitted = rt.store.admit(
            submission.inputs, req_id, owner=owner, idempotency_key=submission.idempotency_key,
            fingerprint=submission.fingerprint, webhook=submission.webhook, **fair,
        )  # fmt: skip
        if answer is not None:
            return then(admitted, answer)
        applied = submission.inline_files and sdk_declaration(rt.validator) is not None
        answered = then(admitted, lambda a: self._admitted(request, a, req_id, owner, applied))
        return self.responder.store_errors(request, answered, req_id)

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

    def _admitted(
        self, request: IRequest, admission: Admission, req_id: str, owner: str = "",
        inline_applied: bool = False,
    ) -> bytes:  # fmt: skip
        refused = self.begin(admission, owner)
        if refused is not None:
            return self.responder.job_error(request, refused, req_id)
        job_id = admission.job_id
        assert job_id is not None
        headers = {"Location": f"/jobs/{job_id}"}
        if inline_applied:
            headers[INLINE_APPLIED[0]] = INLINE_APPLIED[1]
        if admission.replayed:
            headers["Idempotent-Replayed"] = "true"
        body = {"job_id": job_id, "state": "pending", **self._job_urls(job_id)}
        return self.responder.respond(request, 202, json_bytes(body), req_id, headers)

    def begin(self, admission: Admission, owner: str) -> ApiError | None:
        """What every door does with the store's answer: a refusal as its
        :class:`ApiError` (an idempotency conflict 422, the caller's own limit or a
        full queue 429), else None with a new job counted and started (a replay
        starts nothing)."""
        rt = self.runtime
        job_id = admission.job_id
        if admission.conflict:
            return ApiError(
                E.INVALID_REQUEST, "Idempotency-Key: already used for a different request body"
            )
        if job_id is None and admission.over_quota:
            rt.metrics.async_rejected.inc()
            active_of = getattr(rt.store, "active_of", None)  # the Redis store: no read
            pending, running, callers = (
                active_of(owner) if active_of is not None else (admission.limit, 0, 1)
            )
            return over_quota(
                owner, admission.limit, pending, running, callers, rt.mean_run_s("async")
            )
        if job_id is None:
            rt.metrics.async_rejected.inc()
            return ApiError(
                E.TOO_MANY_REQUESTS,
                f"async queue full (max {rt.store.max_queue})",
                {"Retry-After": rt.retry_after("async")},
            )
        if not admission.replayed:
            rt.metrics.job_events["submitted"].inc()
            assert rt.runner is not None
            if rt.store.pull:
                rt.runner.kick()  # a free worker here takes it (or another replica's)
            else:
                rt.runner.start(job_id)
        return None

    @staticmethod
    def _status_body(snap: JobSnapshot) -> bytes:
        return status_body(snap)

    def job_get_prechecks(self, request: IRequest) -> ApiError | None:
        if not self.config.async_enabled:
            return self.jobs_disabled()
        return self.checks.auth_error(request.requestHeaders)

    def job_status(self, request: IRequest, job_id: str) -> Any:
        err = self.job_get_prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        snap = self.runtime.store.snapshot(job_id)
        return self.responder.store_errors(
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
            return self.responder.lookup_error(request, job_id)
        return self.responder.respond(request, 200, self._status_body(snap), rid)

    def job_wait(self, request: IRequest, job_id: str) -> Any:
        err = self.job_get_prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        try:
            budget_ms = parse_wait_timeout(request.args.get(b"timeout", [None])[0])
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, f"invalid timeout: {exc}", status=400)
            return self.responder.job_error(request, bad)
        rid = self.responder.request_id_header(request)
        snap = self.runtime.store.snapshot(job_id)
        answer = then(
            snap, lambda s: self._wait_on(request, job_id, self.visible(request, s), budget_ms, rid)
        )
        return self.responder.store_errors(request, answer, rid)

    def _wait_on(
        self, request: IRequest, job_id: str, snap: JobSnapshot | None, budget_ms: int,
        rid: str | None,
    ) -> Any:  # fmt: skip
        rt = self.runtime
        if snap is None:
            return self.responder.lookup_error(request, job_id)
        if snap.terminal or rt.readiness is Readiness.STOPPING:
            # Terminal, or the server is stopping: no new wait parks (it answers the
            # job's current status at once; the client waits again elsewhere).
            rt.metrics.wakeups_by_reason["immediate"].inc()
            return self.responder.respond(request, 200, self._status_body(snap), rid)
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
            rt.metrics.wakeups_by_reason[reason].inc()
            current = rt.store.snapshot(job_id)
            return then(current, lambda c: self._status_answer(request, job_id, c, rid))

        def on_budget(failure: Any) -> Any:
            failure.trap(DeadlineExpired)
            return answer("budget")

        out: Deferred[bytes] = woke.addCallbacks(lambda _name: answer("terminal"), on_budget)
        return out

    def job_result(self, request: IRequest, job_id: str) -> Any:
        err = self.job_get_prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        lookup = self.runtime.store.take_result(job_id)  # names its owner: one read
        answer = then(lookup, lambda found: self._result_answer(request, job_id, found))
        return self.responder.store_errors(request, answer, rid)

    def _result_answer(self, request: IRequest, job_id: str, lookup: ResultLookup) -> bytes:
        owner, sees_all = self.principal(request)
        if not lookup.found or not (sees_all or lookup.owner == owner):
            return self.responder.lookup_error(request, job_id)  # unknown, or not its job
        if not lookup.done:
            assert lookup.state is not None
            conflict = ApiError(E.JOB_NOT_FINISHED, no_result_message(lookup.state))
            return self.responder.job_error(request, conflict)
        return self.responder.respond(
            request, 200, render_success(lookup.task_id, lookup.result), lookup.task_id
        )
