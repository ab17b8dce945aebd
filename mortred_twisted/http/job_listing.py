"""``GET /jobs?state=&limit=&cursor=``: a caller's jobs, newest first, a page at a
time (edge).

A caller sees its own jobs; a caller with the ``all`` scope (and the port's own token
holder) sees every job (:meth:`~mortred_twisted.http.job_routes.JobRoutes.principal`).
``state`` is a comma list of states, ``limit`` 1–500 (default 50), ``cursor`` the
``next_cursor`` of the page before; a bad value is a 400 naming it.

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.responder import Responder, json_bytes
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.status import status_body
from mortred_twisted.jobs.store import then
from mortred_twisted.jobs.types import JobPage

LIST_DEFAULT_LIMIT = 50
LIST_MAX_LIMIT = 500
STATES_BY_NAME = {s.value: s for s in JobState}


class JobListing:
    """The listing route of one model server. ``prechecks``: the job routes' checks;
    ``principal``: ``(owner, sees_every_job)`` of a request."""

    def __init__(
        self,
        runtime: Any,
        responder: Responder,
        prechecks: Callable[[IRequest], ApiError | None],
        principal: Callable[[IRequest], tuple[str, bool]],
    ) -> None:
        self.runtime = runtime
        self.responder = responder
        self._prechecks = prechecks
        self._principal = principal

    def list_jobs(self, request: IRequest) -> Any:
        err = self._prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        try:
            states, limit, cursor = parse_list_query(request.args)
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, str(exc), status=400)
            return self.responder.job_error(request, bad, rid)
        owner, sees_all = self._principal(request)
        try:
            page = self.runtime.store.list_jobs(
                owner=None if sees_all else owner, states=states, limit=limit, cursor=cursor
            )
        except ValueError as exc:
            bad = ApiError(E.INVALID_REQUEST, str(exc), status=400)
            return self.responder.job_error(request, bad, rid)
        answer = then(page, lambda p: self.responder.respond(request, 200, _page_body(p), rid))
        return self.responder.store_errors(request, answer, rid)


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
