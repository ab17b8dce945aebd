"""Public gateway routes → upstream model-process paths (pure).

The table is the seed's T15 table plus the legacy sync route::

    POST /v1/models/{id}/infer                 -> POST <server_uri>
    POST /v1/models/{id}/jobs                  -> POST /jobs
    GET  /v1/models/{id}/jobs/{job}            -> GET  /jobs/{job}
    GET  /v1/models/{id}/jobs/{job}/wait?...   -> GET  /jobs/{job}/wait?...
    GET  /v1/models/{id}/jobs/{job}/result     -> GET  /jobs/{job}/result
    POST {server_uri}  (legacy, sync only)     -> POST <server_uri>

and the job API beyond the seed (docs/api.md § "Beyond the seed")::

    DELETE /v1/models/{id}/jobs/{job}          -> DELETE /jobs/{job}         (cancel)
    GET  /v1/models/{id}/jobs?state=&limit=&cursor=
                                               -> GET  /jobs?...             (listing)
    GET  /v1/models/{id}/jobs/{job}/events     -> GET  /jobs/{job}/events    (SSE stream)
    GET  /v1/models/{id}/jobs/{job}/files/{name}
                                               -> GET  /jobs/{job}/files/{name} (result file)
    GET  /v1/models/{id}/openapi.json          -> GET  /openapi.json         (paths made public:
                                                                            gateway/openapi.py)

Bare ``/jobs`` is not routed. Matching is split in steps so the edge can answer 405
and 401 before revealing whether a model id exists: :func:`match` looks only at the
path shape, :func:`check_method` picks the route the method selects on that shape
(one path may carry two routes: ``…/jobs`` is submit and listing, ``…/jobs/{job}``
poll and cancel), :func:`resolve` looks the id up in the catalog. The listing's
query is rebuilt from its parsed ``state``, ``limit`` and ``cursor`` only (first value
of each); the wait's is passed as is (the model parses ``timeout`` itself).

A model id served by several processes (``replicas`` and ``[gateway.upstreams]``) has
an :class:`UpstreamSet`: sync inference and job submits go to the healthy upstream
with the fewest requests in flight from this gateway; polls, waits, results, cancels,
listings and event streams to any healthy one (round robin: the job store is
shared). An upstream that refuses a connection is skipped for a short cooldown, and
the request is tried on another one (:meth:`Route.elsewhere`) — safe for every
route, a submit included, since a refused connection provably never reached a
replica (and a cancel is idempotent anyway).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode

from mortred_twisted.config.catalog import Catalog, CatalogEntry

#: Job ids the gateway forwards: the ledger's ``job_<hex>`` shape and anything
#: similarly tame. Others cannot exist upstream, so they are answered 404 locally
#: (and can never smuggle ``..`` or ``%2F`` into the upstream path).
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")
#: Result file names the gateway forwards (``stores/result_files.check_name``'s
#: shape: no ``/``, no leading dot, no escapes); others are answered 404 here.
_SAFE_FILE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}$")


class RouteKind(enum.Enum):
    """What a public path means; the value is the metrics label."""

    INFER = "infer"
    SUBMIT = "jobs_submit"
    POLL = "jobs_poll"
    WAIT = "jobs_wait"
    RESULT = "jobs_result"
    LEGACY = "legacy_infer"
    CANCEL = "jobs_cancel"
    LIST = "jobs_list"
    EVENTS = "jobs_events"
    QUEUE = "queue"
    FILE = "jobs_file"
    OPENAPI = "openapi"
    OPENAI_IMAGES = "openai_images"  # /v1/models/<id>/openai/v1/images/generations
    OPENAI_MODELS = "openai_models"  # /v1/models/<id>/openai/v1/models
    OPENAI_EDITS = "openai_edits"  # /v1/models/<id>/openai/v1/images/edits (multipart)
    OIP_READ = "oip_read"  # /v1/models/<id>/oip/v2[/health/*|/models/<m>[/ready]]
    OIP_INFER = "oip_infer"  # /v1/models/<id>/oip/v2/models/<m>/infer
    REPLICATE_READ = "replicate_read"  # /v1/models/<id>/replicate/v1/… GET
    REPLICATE_POST = "replicate_post"  # /v1/models/<id>/replicate/v1/… POST


#: Per path shape (the kind :func:`match` returns for it): the route each allowed
#: method selects.
METHOD_KINDS: dict[RouteKind, dict[str, RouteKind]] = {
    RouteKind.INFER: {"POST": RouteKind.INFER},
    RouteKind.SUBMIT: {"POST": RouteKind.SUBMIT, "GET": RouteKind.LIST},
    RouteKind.POLL: {"GET": RouteKind.POLL, "DELETE": RouteKind.CANCEL},
    RouteKind.WAIT: {"GET": RouteKind.WAIT},
    RouteKind.RESULT: {"GET": RouteKind.RESULT},
    RouteKind.EVENTS: {"GET": RouteKind.EVENTS},
    RouteKind.LEGACY: {"POST": RouteKind.LEGACY},
    RouteKind.QUEUE: {"GET": RouteKind.QUEUE},
    RouteKind.FILE: {"GET": RouteKind.FILE},
    RouteKind.OPENAPI: {"GET": RouteKind.OPENAPI},
    RouteKind.OPENAI_IMAGES: {"POST": RouteKind.OPENAI_IMAGES},
    RouteKind.OPENAI_MODELS: {"GET": RouteKind.OPENAI_MODELS},
    RouteKind.OPENAI_EDITS: {"POST": RouteKind.OPENAI_EDITS},
    RouteKind.OIP_READ: {"GET": RouteKind.OIP_READ},
    RouteKind.OIP_INFER: {"POST": RouteKind.OIP_INFER},
    RouteKind.REPLICATE_READ: {"GET": RouteKind.REPLICATE_READ},
    RouteKind.REPLICATE_POST: {"POST": RouteKind.REPLICATE_POST},
}
#: Methods allowed per path shape (the ``Allow`` of a 405), in that order.
ALLOWED_METHODS: dict[RouteKind, tuple[str, ...]] = {
    kind: tuple(methods) for kind, methods in METHOD_KINDS.items()
}
#: Query keys of the listing forwarded upstream (the first value of each).
LIST_QUERY_KEYS = ("state", "limit", "cursor")


@dataclass(frozen=True)
class Match:
    """A path that has the shape of a public route (the model may not exist)."""

    kind: RouteKind
    model_id: str
    job_id: str | None = None
    file: str | None = None  # a result file's name (FILE), the model port's path (OIP_*)


#: Seconds an upstream that refused a connection is skipped (while others remain).
REFUSED_COOLDOWN_S = 2.0
#: Routes that start work: they go to the least busy upstream.
_BALANCED = frozenset({RouteKind.INFER, RouteKind.SUBMIT, RouteKind.LEGACY})


class UpstreamSet:
    """The processes serving one model id, as seen by this gateway (reactor thread).

    Counts the requests this gateway has in flight to each upstream and remembers
    which refused connections lately; health otherwise comes from the answers.
    """

    def __init__(self, urls: tuple[str, ...], clock: Callable[[], float]) -> None:
        if not urls:
            raise ValueError("an upstream set needs at least one URL")
        self.urls = urls
        self._clock = clock
        self.outstanding: dict[str, int] = dict.fromkeys(urls, 0)
        self._down_until: dict[str, float] = {}
        self._next = 0

    def healthy(self) -> list[str]:
        now = self._clock()
        return [u for u in self.urls if self._down_until.get(u, 0.0) <= now]

    def pick(self, kind: RouteKind, exclude: frozenset[str] = frozenset()) -> str | None:
        """The upstream for a new request of ``kind``, or None when all are excluded."""
        candidates = [u for u in self.healthy() if u not in exclude]
        if not candidates:  # every one refused lately: try them anyway
            candidates = [u for u in self.urls if u not in exclude]
        if not candidates:
            return None
        n = len(candidates)
        start = self._next % n
        self._next += 1
        rotated = candidates[start:] + candidates[:start]
        if kind in _BALANCED:
            return min(rotated, key=lambda u: self.outstanding[u])
        return rotated[0]

    def begin(self, url: str) -> None:
        self.outstanding[url] += 1

    def end(self, url: str) -> None:
        self.outstanding[url] -= 1

    def refused(self, url: str) -> None:
        """``url`` refused a connection: skip it for :data:`REFUSED_COOLDOWN_S`."""
        self._down_until[url] = self._clock() + REFUSED_COOLDOWN_S


class Upstreams:
    """An :class:`UpstreamSet` per catalog id served by more than one process."""

    def __init__(self, catalog: Catalog, clock: Callable[[], float]) -> None:
        self.sets: Mapping[str, UpstreamSet] = {
            e.id: UpstreamSet(e.upstream_urls, clock)
            for e in catalog.values()
            if len(e.upstream_urls) > 1
        }

    def get(self, model_id: str) -> UpstreamSet | None:
        return self.sets.get(model_id)


@dataclass
class Route:
    """A resolved route: which model process, and the upstream path (with query).

    With an upstream set, :meth:`start` counts the request against its upstream and
    :meth:`finish` releases it; :meth:`elsewhere` is the same route on another
    upstream after a refused connection.
    """

    kind: RouteKind
    entry: CatalogEntry
    upstream_path: str
    job_id: str | None = None
    base: str = ""
    upstreams: UpstreamSet | None = None
    tried: frozenset[str] = field(default_factory=frozenset)

    @property
    def url(self) -> str:
        return (self.base or self.entry.base_url) + self.upstream_path

    def start(self) -> None:
        if self.upstreams is not None:
            self.upstreams.begin(self.base)

    def finish(self) -> None:
        if self.upstreams is not None:
            self.upstreams.end(self.base)

    def elsewhere(self) -> Route | None:
        """After a refused connection: the route on an upstream not tried yet, or None."""
        if self.upstreams is None:
            return None
        self.upstreams.refused(self.base)
        tried = self.tried | {self.base}
        other = self.upstreams.pick(self.kind, tried)
        if other is None:
            return None
        return Route(
            self.kind, self.entry, self.upstream_path, self.job_id, other, self.upstreams, tried
        )


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
        if rest == ["queue"]:
            return Match(RouteKind.QUEUE, model_id)
        if rest == ["openapi.json"]:
            return Match(RouteKind.OPENAPI, model_id)
        if rest[:2] == ["openai", "v1"]:  # the OpenAI door's base URL (docs/protocols.md)
            if rest[2:] == ["images", "generations"]:
                return Match(RouteKind.OPENAI_IMAGES, model_id)
            if rest[2:] == ["models"]:
                return Match(RouteKind.OPENAI_MODELS, model_id)
            if rest[2:] == ["images", "edits"]:
                return Match(RouteKind.OPENAI_EDITS, model_id)
            return None
        if rest[:2] == ["oip", "v2"]:  # the Open Inference Protocol door's base URL
            return _oip_match(model_id, rest[1:])
        if rest[:2] == ["replicate", "v1"]:  # the Replicate door's base URL
            return _replicate_match(model_id, rest[1:])
        if len(rest) >= 2 and rest[0] == "jobs" and rest[1]:
            job = rest[1]
            if len(rest) == 2:
                return Match(RouteKind.POLL, model_id, job)
            if rest[2:] == ["wait"]:
                return Match(RouteKind.WAIT, model_id, job)
            if rest[2:] == ["result"]:
                return Match(RouteKind.RESULT, model_id, job)
            if rest[2:] == ["events"]:
                return Match(RouteKind.EVENTS, model_id, job)
            if len(rest) == 4 and rest[2] == "files" and rest[3]:
                return Match(RouteKind.FILE, model_id, job, rest[3])
        return None
    entry = catalog.by_uri(path)
    if entry is not None:
        return Match(RouteKind.LEGACY, entry.id)
    return None


def _oip_match(model_id: str, rest: list[str]) -> Match | None:
    """The OIP paths the door serves (``rest`` starts with ``v2``); the model port
    path is kept in ``file`` (each segment a safe one: it is forwarded as is)."""
    if not all(_SAFE_SEGMENT.match(part) for part in rest):
        return None
    path = "/" + "/".join(rest)
    if rest in (["v2"], ["v2", "health", "live"], ["v2", "health", "ready"]):
        return Match(RouteKind.OIP_READ, model_id, file=path)
    if len(rest) >= 3 and rest[1] == "models":
        if len(rest) == 3 or rest[3:] == ["ready"]:
            return Match(RouteKind.OIP_READ, model_id, file=path)
        if rest[3:] == ["infer"]:
            return Match(RouteKind.OIP_INFER, model_id, file=path)
    return None


def _replicate_match(model_id: str, rest: list[str]) -> Match | None:
    """The Replicate paths the door serves (``rest`` starts with ``v1``)."""
    if not all(_SAFE_SEGMENT.match(part) for part in rest):
        return None
    path = "/" + "/".join(rest)
    tail = rest[1:]
    if tail == ["predictions"]:
        return Match(RouteKind.REPLICATE_POST, model_id, file=path)
    if len(tail) == 2 and tail[0] == "predictions":
        return Match(RouteKind.REPLICATE_READ, model_id, file=path)
    if len(tail) == 3 and tail[0] == "predictions" and tail[2] == "cancel":
        return Match(RouteKind.REPLICATE_POST, model_id, file=path)
    if len(tail) >= 3 and tail[0] == "models":
        if len(tail) == 3 or (len(tail) == 5 and tail[3] == "versions"):
            return Match(RouteKind.REPLICATE_READ, model_id, file=path)
        if tail[3:] == ["predictions"]:
            return Match(RouteKind.REPLICATE_POST, model_id, file=path)
    return None


def check_method(m: Match, method: str) -> Match:
    """The match of the route ``method`` selects on ``m``'s path (``m`` itself when
    it is the shape's first route); raises a 405 :class:`RouteError` (with ``Allow``)
    for a method the path does not take."""
    kind = METHOD_KINDS[m.kind].get(method)
    if kind is None:
        allowed = ALLOWED_METHODS[m.kind]
        raise RouteError(
            405,
            f"method not allowed: {method} (allowed: {', '.join(allowed)})",
            {"Allow": ", ".join(allowed)},
        )
    if kind is m.kind:
        return m
    return Match(kind, m.model_id, m.job_id)


def list_query(query: str) -> str:
    """The listing's query as forwarded: only ``state``, ``limit`` and ``cursor``,
    the first value of each, re-encoded (anything else the client sent is dropped)."""
    kept: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=False):
        if name in LIST_QUERY_KEYS and name not in kept:
            kept[name] = value
    return urlencode([(k, kept[k]) for k in LIST_QUERY_KEYS if k in kept])


def resolve(
    m: Match, catalog: Catalog, query: str = "", upstreams: Upstreams | None = None
) -> Route:
    """The upstream route for ``m``; raises a 404 :class:`RouteError` for an unknown
    or disabled model id, or a job id that cannot exist. With ``upstreams``, an id
    served by several processes gets one picked for this request."""
    entry = catalog.get(m.model_id)
    if entry is None or not entry.enabled:
        raise RouteError(404, f"unknown model: {m.model_id}")
    route = _resolve_path(m, entry, query)
    group = upstreams.get(entry.id) if upstreams is not None else None
    if group is not None:
        route.upstreams = group
        route.base = group.pick(route.kind) or entry.base_url
    return route


def _resolve_path(m: Match, entry: CatalogEntry, query: str) -> Route:
    if m.kind in (RouteKind.INFER, RouteKind.LEGACY):
        return Route(m.kind, entry, entry.server_uri)
    if m.kind is RouteKind.SUBMIT:
        return Route(m.kind, entry, "/jobs")
    if m.kind is RouteKind.QUEUE:
        return Route(m.kind, entry, "/queue")
    if m.kind is RouteKind.OPENAPI:
        return Route(m.kind, entry, "/openapi.json")
    if m.kind is RouteKind.OPENAI_IMAGES:
        return Route(m.kind, entry, "/v1/images/generations")
    if m.kind is RouteKind.OPENAI_MODELS:
        return Route(m.kind, entry, "/v1/models")
    if m.kind is RouteKind.OPENAI_EDITS:
        return Route(m.kind, entry, "/v1/images/edits")
    if m.kind in (
        RouteKind.OIP_READ, RouteKind.OIP_INFER, RouteKind.REPLICATE_READ,
        RouteKind.REPLICATE_POST,
    ):  # fmt: skip
        return Route(m.kind, entry, m.file or "/")
    if m.kind is RouteKind.LIST:
        forwarded = list_query(query) if query else ""
        return Route(m.kind, entry, "/jobs" + (f"?{forwarded}" if forwarded else ""))
    job = m.job_id or ""
    if not _SAFE_SEGMENT.match(job):
        raise RouteError(404, f"job not found: {unquote(job)}")
    path = f"/jobs/{job}"
    if m.kind is RouteKind.WAIT:
        path += "/wait" + (f"?{query}" if query else "")
    elif m.kind is RouteKind.RESULT:
        path += "/result"
    elif m.kind is RouteKind.EVENTS:
        path += "/events"
    elif m.kind is RouteKind.FILE:
        name = m.file or ""
        if not _SAFE_FILE.fullmatch(name) or name in (".", ".."):
            raise RouteError(404, f"file not found: {unquote(name)[:200]}")
        path += f"/files/{name}"
    return Route(m.kind, entry, path, job)
