"""Public gateway routes → upstream model-process paths (pure).

The table is the seed's T15 table plus the legacy sync route::

    POST /v1/models/{id}/infer                 -> POST <server_uri>
    POST /v1/models/{id}/jobs                  -> POST /jobs
    GET  /v1/models/{id}/jobs/{job}            -> GET  /jobs/{job}
    GET  /v1/models/{id}/jobs/{job}/wait?...   -> GET  /jobs/{job}/wait?...
    GET  /v1/models/{id}/jobs/{job}/result     -> GET  /jobs/{job}/result
    POST {server_uri}  (legacy, sync only)     -> POST <server_uri>

Bare ``/jobs`` is not routed. Matching is split in two steps so the edge can answer
405 and 401 before revealing whether a model id exists: :func:`match` looks only at
the path shape, :func:`resolve` looks the id up in the catalog.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import unquote

from mortred_twisted.config.catalog import Catalog, CatalogEntry

#: Job ids the gateway forwards: the ledger's ``job_<hex>`` shape and anything
#: similarly tame. Others cannot exist upstream, so they are answered 404 locally
#: (and can never smuggle ``..`` or ``%2F`` into the upstream path).
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")


class RouteKind(enum.Enum):
    """What a public path means; the value is the metrics label."""

    INFER = "infer"
    SUBMIT = "jobs_submit"
    POLL = "jobs_poll"
    WAIT = "jobs_wait"
    RESULT = "jobs_result"
    LEGACY = "legacy_infer"


ALLOWED_METHODS: dict[RouteKind, tuple[str, ...]] = {
    RouteKind.INFER: ("POST",),
    RouteKind.SUBMIT: ("POST",),
    RouteKind.POLL: ("GET",),
    RouteKind.WAIT: ("GET",),
    RouteKind.RESULT: ("GET",),
    RouteKind.LEGACY: ("POST",),
}


@dataclass(frozen=True)
class Match:
    """A path that has the shape of a public route (the model may not exist)."""

    kind: RouteKind
    model_id: str
    job_id: str | None = None


@dataclass(frozen=True)
class Route:
    """A resolved route: which model process, and the upstream path (with query)."""

    kind: RouteKind
    entry: CatalogEntry
    upstream_path: str
    job_id: str | None = None

    @property
    def url(self) -> str:
        return self.entry.base_url + self.upstream_path


class RouteError(Exception):
    """A request the gateway answers itself: ``status`` and a ``{"error"}`` body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def match(path: str, catalog: Catalog) -> Match | None:
    """The route shape of ``path`` (no query string), or None when nothing matches."""
    if path.startswith("/v1/models/"):
        parts = path[len("/v1/models/") :].split("/")
        model_id = unquote(parts[0])
        if not model_id:
            return None
        rest = parts[1:]
        if rest == ["infer"]:
            return Match(RouteKind.INFER, model_id)
        if rest == ["jobs"]:
            return Match(RouteKind.SUBMIT, model_id)
        if len(rest) >= 2 and rest[0] == "jobs" and rest[1]:
            job = rest[1]
            if len(rest) == 2:
                return Match(RouteKind.POLL, model_id, job)
            if rest[2:] == ["wait"]:
                return Match(RouteKind.WAIT, model_id, job)
            if rest[2:] == ["result"]:
                return Match(RouteKind.RESULT, model_id, job)
        return None
    entry = catalog.by_uri(path)
    if entry is not None:
        return Match(RouteKind.LEGACY, entry.id)
    return None


def check_method(m: Match, method: str) -> None:
    """Raise a 405 :class:`RouteError` (with ``Allow``) for a wrong method."""
    allowed = ALLOWED_METHODS[m.kind]
    if method not in allowed:
        raise RouteError(
            405,
            f"method not allowed: {method} (allowed: {', '.join(allowed)})",
            {"Allow": ", ".join(allowed)},
        )


def resolve(m: Match, catalog: Catalog, query: str = "") -> Route:
    """The upstream route for ``m``; raises a 404 :class:`RouteError` for an unknown
    or disabled model id, or a job id that cannot exist."""
    entry = catalog.get(m.model_id)
    if entry is None or not entry.enabled:
        raise RouteError(404, f"unknown model: {m.model_id}")
    if m.kind in (RouteKind.INFER, RouteKind.LEGACY):
        return Route(m.kind, entry, entry.server_uri)
    if m.kind is RouteKind.SUBMIT:
        return Route(m.kind, entry, "/jobs")
    job = m.job_id or ""
    if not _SAFE_SEGMENT.match(job):
        raise RouteError(404, f"job not found: {unquote(job)}")
    path = f"/jobs/{job}"
    if m.kind is RouteKind.WAIT:
        path += "/wait" + (f"?{query}" if query else "")
    elif m.kind is RouteKind.RESULT:
        path += "/result"
    return Route(m.kind, entry, path, job)
