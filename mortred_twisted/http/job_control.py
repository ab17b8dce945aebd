"""The job API beyond the seed (model port): cancel, listing, live events, callers.

Routes (docs/api.md § "Beyond the seed"): ``DELETE /jobs/{id}`` (cancel),
``GET /jobs?state=&limit=&cursor=`` (listing, newest first), ``GET
/jobs/{id}/events`` (server-sent events). Mixed into
:class:`~mortred_twisted.http.model_server.ModelServerApp`; thin like the other
routes: check, one call into the store/runner, render.

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

from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.edge import json_bytes
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http11 import sse
from mortred_twisted.jobs.ledger import JobPage, JobSnapshot
from mortred_twisted.jobs.states import CancelOutcome, JobState
from mortred_twisted.jobs.status import status_body
from mortred_twisted.jobs.store import settle, then
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.job_events import events_counter

PRINCIPAL_HEADER = b"X-Mortred-Principal"
PRINCIPAL_SCOPE_HEADER = b"X-Mortred-Principal-Scope"
MAX_PRINCIPAL_LENGTH = 128
LIST_DEFAULT_LIMIT = 50
LIST_MAX_LIMIT = 500
HEARTBEAT_S = 15.0
STATES_BY_NAME = {s.value: s for s in JobState}


class JobControlRoutes:
    """Mixin of the model server app; see the module docstring."""

    runtime: Any
    _token: str | None

    # -- who is asking ------------------------------------------------------------

    def principal(self, request: IRequest) -> tuple[str, bool]:
        """``(owner, sees_every_job)`` of this request (see the module docstring)."""
        if self._token is None:
            return "", True
        raw = request.requestHeaders.getRawHeaders(PRINCIPAL_HEADER, [None])[0]
        if not raw:
            return "", True
        name = raw.decode("utf-8", "replace").strip()[:MAX_PRINCIPAL_LENGTH]
        scope = request.requestHeaders.getRawHeaders(PRINCIPAL_SCOPE_HEADER, [b""])[0]
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

    # -- cancel -------------------------------------------------------------------

    def cancel_job(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)  # type: ignore[attr-defined]
        if err is not None:
            return self._job_error(request, err)  # type: ignore[attr-defined]
        rid = self._request_id_header(request)  # type: ignore[attr-defined]

        def cancel(visible: bool) -> Any:
            if not visible:  # another caller's job: as unknown, and left alone
                return self._job_lookup_error(request, job_id)  # type: ignore[attr-defined]
            return then(
                self.runtime.store.cancel(job_id),
                lambda out: self._cancelled(request, job_id, *out, rid),
            )

        answer = then(self.owns(request, job_id), cancel)
        return self._store_errors(request, answer, rid)  # type: ignore[attr-defined]

    def _cancelled(
        self,
        request: IRequest,
        job_id: str,
        outcome: CancelOutcome,
        snap: JobSnapshot | None,
        rid: str | None,
    ) -> bytes:
        rt = self.runtime
        if outcome is CancelOutcome.UNKNOWN or snap is None:
            return self._job_lookup_error(request, job_id)  # type: ignore[attr-defined]
        if outcome is CancelOutcome.FINISHED:
            conflict = ApiError(
                E.JOB_NOT_FINISHED, f"job already finished (state: {snap.state.value})"
            )
            return self._job_error(request, conflict, rid)  # type: ignore[attr-defined]
        if rt.runner is not None:
            rt.runner.cancel(job_id)
        if outcome is CancelOutcome.CANCELLED:
            # A pending job ended here: what the runner's terminal step does.
            rt.metrics.job_events["cancelled"].inc()
            rt.counters.count_by_name(job_id, None)
            rt.events.ended(job_id)
            return self._respond(request, 200, status_body(snap), rid)  # type: ignore[attr-defined]
        return self._respond(request, 202, status_body(snap), rid)  # type: ignore[attr-defined]

    # -- listing ------------------------------------------------------------------

    def list_jobs(self, request: IRequest) -> Any:
        err = self._job_get_prechecks(request)  # type: ignore[attr-defined]
        if err is not None:
            return self._job_error(request, err)  # type: ignore[attr-defined]
        rid = self._request_id_header(request)  # type: ignore[attr-defined]
        try:
            states, limit, cursor = parse_list_query(request.args)
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, str(exc), status=400)
            return self._job_error(request, bad, rid)  # type: ignore[attr-defined]
        owner, sees_all = self.principal(request)
        try:
            page = self.runtime.store.list_jobs(
                owner=None if sees_all else owner, states=states, limit=limit, cursor=cursor
            )
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, str(exc), status=400)
            return self._job_error(request, bad, rid)  # type: ignore[attr-defined]
        answer = then(page, lambda p: self._respond(request, 200, _page_body(p), rid))  # type: ignore[attr-defined]
        return self._store_errors(request, answer, rid)  # type: ignore[attr-defined]

    # -- live events --------------------------------------------------------------

    def job_events(self, request: IRequest, job_id: str) -> Any:
        err = self._job_get_prechecks(request)  # type: ignore[attr-defined]
        if err is not None:
            return self._job_error(request, err)  # type: ignore[attr-defined]
        rid = self._request_id_header(request)  # type: ignore[attr-defined]
        first = self.runtime.store.snapshot(job_id)

        def start(snap: JobSnapshot | None) -> Any:
            snap = self.visible(request, snap)
            if snap is None:
                return self._job_lookup_error(request, job_id)  # type: ignore[attr-defined]
            return Deferred.fromCoroutine(self._stream(request, job_id, snap, rid))

        return self._store_errors(request, then(first, start), rid)  # type: ignore[attr-defined]

    async def _stream(
        self, request: IRequest, job_id: str, snap: JobSnapshot, rid: str | None
    ) -> bytes:
        """Write the job's events until it is terminal (or the client leaves: Klein
        then cancels this coroutine, which removes its counter)."""
        rt = self.runtime
        request.setResponseCode(200)
        self._headers(request, rid)  # type: ignore[attr-defined]
        request.setHeader(b"Content-Type", sse.CONTENT_TYPE)
        request.setHeader(b"Cache-Control", b"no-cache")
        request.setHeader(b"X-Accel-Buffering", b"no")  # tell proxies not to buffer
        rt.metrics.event_streams.inc()
        seq = 0
        try:
            request.write(sse.retry(2000))
            seq += 1
            request.write(_event(snap, seq, initial=True))
            last = _key(snap)
            while not snap.terminal:
                woke = rt.counters.counter(events_counter(job_id), 1)
                # Named counters are counted for the terminal event as well; a
                # shared store's events may arrive between the read and the
                # counter, so read again once it is registered.
                again = await settle(rt.store.snapshot(job_id))
                if again is None or _key(again) != last:
                    woke.addErrback(lambda _f: None)
                    woke.cancel()
                else:
                    try:
                        await within(rt.clock, woke, HEARTBEAT_S, cancel_on_expiry=True)
                    except DeadlineExpired:
                        request.write(sse.comment("ping"))
                        continue
                    again = await settle(rt.store.snapshot(job_id))
                if again is None:  # evicted (retention) while we streamed
                    break
                snap = again
                current = _key(snap)
                if current != last:
                    seq += 1
                    request.write(_event(snap, seq, initial=False, previous=last[0]))
                    last = current
        finally:
            rt.metrics.event_streams.dec()
        return b""


def _key(snap: JobSnapshot) -> tuple[Any, ...]:
    """What an event stream reports a change of."""
    return (snap.state, snap.progress, snap.cancel_requested)


def _event(snap: JobSnapshot, seq: int, *, initial: bool, previous: Any = None) -> bytes:
    if snap.terminal:
        name = snap.state.value
    elif initial or snap.state is not previous:
        name = "state"
    else:
        name = "progress"
    return sse.event(name, status_body(snap).decode("utf-8"), seq)


def _page_body(page: JobPage) -> bytes:
    jobs = b",".join(status_body(s) for s in page.jobs)
    cursor = json_bytes(page.next_cursor)
    return b'{"jobs":[' + jobs + b'],"next_cursor":' + cursor + b"}"


def parse_list_query(
    args: dict[bytes, list[bytes]],
) -> tuple[frozenset[JobState] | None, int, str | None]:
    """``state`` (comma list), ``limit`` (1–500, default 50), ``cursor``; ValueError."""
    states: frozenset[JobState] | None = None
    raw_states = args.get(b"state", [b""])[0].decode("utf-8", "replace").strip()
    if raw_states:
        names = [n.strip() for n in raw_states.split(",") if n.strip()]
        unknown = [n for n in names if n not in STATES_BY_NAME]
        if unknown:
            raise ValueError(
                f"unknown state {unknown[0][:32]!r} (known: {', '.join(STATES_BY_NAME)})"
            )
        states = frozenset(STATES_BY_NAME[n] for n in names)
    raw_limit = args.get(b"limit", [b""])[0].decode("ascii", "replace").strip()
    limit = LIST_DEFAULT_LIMIT
    if raw_limit:
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= LIST_MAX_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {LIST_MAX_LIMIT}")
        limit = int(raw_limit)
    cursor = args.get(b"cursor", [b""])[0].decode("ascii", "replace").strip() or None
    return states, limit, cursor
