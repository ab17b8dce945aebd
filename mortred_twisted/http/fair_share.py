"""A caller's share of a model port: its terms from the gateway, the ``priority``
of a submit, the caller's 429, and ``GET /queue``.

**Terms.** The gateway names the caller's API-key terms with three headers, sent
(and believed) only with the port's internal token, like ``X-Mortred-Principal``:
``X-Mortred-Weight`` (1–1000), ``X-Mortred-Max-Pending`` (0 = the model's
``async_max_queue_per_caller``) and ``X-Mortred-Max-Priority`` (``low`` | ``normal``
| ``high``). A malformed value is ignored (the default applies). A caller named
by ``X-Mortred-Principal`` without a ``X-Mortred-Max-Priority`` may ask for
``normal`` at most; the port's own token holder (no principal) for ``high``.

**Priority.** The submit's envelope field ``priority`` (``low`` | ``normal`` |
``high``, default ``normal``); above the caller's ``max_priority`` → 422 naming the
limit.

**Queue.** ``GET /queue``: ``depth`` (pending + running), ``pending``, ``running``,
``oldest_wait_ms``, ``max_queue`` and ``callers`` (one line per caller with jobs
for a caller that sees every job, else only its own line).

Thread contract: reactor thread only.
"""

from __future__ import annotations

from typing import Any

from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.responder import json_bytes
from mortred_twisted.jobs.fair_queue import (
    DEFAULT_PRIORITY,
    MAX_WEIGHT,
    PRIORITIES,
    CallerTerms,
    priority_rank,
)
from mortred_twisted.jobs.status import retry_after_s
from mortred_twisted.jobs.types import QueueView

WEIGHT_HEADER = b"X-Mortred-Weight"
MAX_PENDING_HEADER = b"X-Mortred-Max-Pending"
MAX_PRIORITY_HEADER = b"X-Mortred-Max-Priority"
#: Terms of the port's own token holder (no principal): every band.
OPERATOR_TERMS = CallerTerms(max_priority="high")


def _header(request: IRequest, name: bytes) -> str | None:
    raw = request.requestHeaders.getRawHeaders(name, [None])[0]
    return None if raw is None else raw.decode("latin-1").strip()


def caller_terms(request: IRequest, *, trusted: bool, has_principal: bool) -> CallerTerms:
    """The caller's terms from the gateway's headers (``trusted``: the request
    carried the port's token), else the defaults (module docstring)."""
    if not (trusted and has_principal):
        return OPERATOR_TERMS
    weight = _header(request, WEIGHT_HEADER)
    pending = _header(request, MAX_PENDING_HEADER)
    top = _header(request, MAX_PRIORITY_HEADER)
    return CallerTerms(
        weight=int(weight) if weight and weight.isdigit() and 1 <= int(weight) <= MAX_WEIGHT else 1,
        max_pending=int(pending) if pending and pending.isdigit() and int(pending) > 0 else None,
        max_priority=top if top in PRIORITIES else DEFAULT_PRIORITY,
    )


def check_priority(fields: dict[str, Any], terms: CallerTerms) -> str:
    """The submit's band; :class:`ApiError` (422) when unknown or above the limit."""
    value = fields.get("priority", DEFAULT_PRIORITY)
    if not isinstance(value, str) or value not in PRIORITIES:
        raise ApiError(E.INVALID_REQUEST, f"priority: must be one of {', '.join(PRIORITIES)}")
    if priority_rank(value) > priority_rank(terms.max_priority):
        raise ApiError(
            E.INVALID_REQUEST,
            f"priority: {value!r} is above this caller's max_priority ({terms.max_priority!r})",
        )
    return value


def over_quota(
    owner: str, limit: int, pending: int, running: int, callers: int, mean_run_s: float | None
) -> ApiError:
    """The 429 of a caller at its own limit. ``Retry-After`` comes from the caller's
    backlog: with jobs running, one of them ends in ``mean / running``; with none
    running yet, its first pending job starts after about one start per caller
    holding jobs (fair order) and then runs."""
    if running > 0:
        seconds = retry_after_s(mean_run_s, running, 0)
    else:
        seconds = retry_after_s(mean_run_s, 1, max(0, callers - 1))
    who = owner or "this port"
    return ApiError(
        E.TOO_MANY_REQUESTS,
        f"caller quota reached: {who} has {pending + running} jobs pending or running "
        f"(its max_pending is {limit}); this is the caller's own limit, not the "
        "model's queue",
        {"Retry-After": str(seconds)},
    )


def queue_body(view: QueueView) -> bytes:
    """The ``GET /queue`` document."""
    return json_bytes(
        {
            "depth": view.depth,
            "pending": view.pending,
            "running": view.running,
            "oldest_wait_ms": view.oldest_wait_ms,
            "max_queue": view.max_queue,
            "callers": [
                {
                    "caller": line.caller,
                    "pending": line.pending,
                    "running": line.running,
                    "oldest_wait_ms": line.oldest_wait_ms,
                    "max_pending": line.limit,
                }
                for line in view.callers
            ],
        }
    )
