"""Admission at zero replicas: the gateway admits a submit into the model's Redis job
store itself while no replica is up, and answers the job's polls, waits and results
from there (reactor thread).

An autoscaled id on the Redis store shares its jobs through Redis, so a job admitted
here is the same job record a replica would have admitted: the replica that comes up
claims and runs it. What admits is the model port's own code, run *headless*: the
same :class:`~mortred_twisted.http.job_routes.JobRoutes` and
:class:`~mortred_twisted.http.request_checks.RequestChecks` over a
:class:`~mortred_twisted.runtime.model_runtime.ModelRuntime` of the model's server
config (its Redis store, submit settings, idempotency, callers and fair share,
``async_max_queue``, webhook checks, TTL), with no worker pool and no runner. It
validates with the model's *validation twin*, which every replica publishes into
Redis at ready (:mod:`~mortred_twisted.runtime.validation_twin`): a bad input is the
model's own 422, before anything is admitted.

:meth:`ColdAdmission.serve` takes the request the gateway would have forwarded (its
route, the upstream headers: internal token, ``X-Mortred-Principal*``, fair-share
terms, ``Idempotency-Key``; the body) and answers like the model port would
(:class:`LocalResponse`), or None when it cannot: then the gateway holds the
request as before (:mod:`~mortred_twisted.gateway.cold_start`). It cannot when the
id is not admitted here (not autoscaled, memory store, async off, its server file
unreadable), when the route is another one (cancel, listing, events, files: they
have side effects a replica owns, or a replica's state), when Redis is not reached,
or, for a submit, when the twin is absent, refused (``"admit": false``: a built-in
whose ``validate`` is code), damaged, or published with other settings than the
server file has now (each reason is logged once per document).

The server config is read as the supervisor's children read it (the server TOML with
this process's environment, which the supervisor gives both), with the model's
``auth_token`` set to the internal token when there is one (``MORTRED_AUTH_TOKEN``
of a child). Ownership: each :class:`HeadlessJobs` owns its store's Redis link
(:meth:`ColdAdmission.start`/``stop``); the store runs no upkeep (``upkeep =
False``): the replicas' MAINTAIN renews, reclaims and times out.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import ServerConfig, load_server_config
from mortred_twisted.gateway.routing import Route, RouteKind
from mortred_twisted.runtime.validation_twin import parse_twin, twin_key

log = Logger()

#: The routes served here, by the name of their :class:`JobRoutes` handler.
HANDLERS = {
    RouteKind.SUBMIT: "submit_job",
    RouteKind.POLL: "job_status",
    RouteKind.WAIT: "job_wait",
    RouteKind.RESULT: "job_result",
}
_LOOPBACK = IPv4Address("TCP", "127.0.0.1", 0)


@dataclass(frozen=True)
class LocalResponse:
    """An answer made here, shaped as an upstream response for the gateway's
    rendering (``code``, ``headers`` with ``getRawHeaders``/``getAllRawHeaders``,
    ``body``)."""

    code: int
    headers: Headers
    body: bytes


class LocalRequest:
    """The request a model port's route would see (the :class:`~mortred_twisted.http.
    route_request.RouteRequest` subset the job routes use), built from what the
    gateway would forward."""

    def __init__(
        self, method: bytes, uri: bytes, headers: Mapping[bytes, list[bytes]], body: bytes | None
    ) -> None:
        self.method = method
        self.uri = uri
        self.path = uri.partition(b"?")[0]
        self.clientproto = b"HTTP/1.1"
        self.requestHeaders = Headers(dict(headers))
        self.responseHeaders = Headers()
        self.content = io.BytesIO(body or b"")
        self.code = 200
        self.decided = None
        self._args: dict[bytes, list[bytes]] | None = None

    @property
    def args(self) -> dict[bytes, list[bytes]]:
        if self._args is None:
            from urllib.parse import parse_qs

            query = self.uri.partition(b"?")[2]
            self._args = parse_qs(query, keep_blank_values=True) if query else {}
        return self._args

    def getHeader(self, name: bytes) -> bytes | None:
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def getClientAddress(self) -> IPv4Address:
        return _LOOPBACK  # the client's address travels in X-Mortred-Client-IP

    def answer(self, body: bytes) -> LocalResponse:
        return LocalResponse(self.code, self.responseHeaders, body)


class _NoThreads:
    """A headless runtime loads no model and runs nothing on threads."""

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        return defer.fail(RuntimeError("a headless admission runs no model"))


class _NoRunner:
    """In place of the job runner: the replicas claim the jobs admitted here."""

    def kick(self) -> None:
        pass

    def cancel(self, job_id: str) -> None:
        pass

    def start(self, job_id: str) -> None:
        raise RuntimeError("the Redis store is pull-only")


class HeadlessJobs:
    """The job routes of one model id over its Redis store, with no model loaded:
    validation by the published twin (see the module docstring)."""

    def __init__(self, config: ServerConfig, clock: IReactorTime) -> None:
        from mortred_twisted.http.job_routes import JobRoutes
        from mortred_twisted.http.request_checks import RequestChecks
        from mortred_twisted.http.responder import Responder
        from mortred_twisted.http11.ratelimit import RateLimiter
        from mortred_twisted.runtime.model_runtime import ModelRuntime

        self.config = config
        self.runtime = ModelRuntime(config, clock=clock, threads=_NoThreads())
        self.runtime.store.upkeep = False
        self.runtime.runner = _NoRunner()  # type: ignore[assignment]
        limiter = RateLimiter(clock.seconds) if config.rate_limit_qps > 0 else None
        responder = Responder()
        checks = RequestChecks(self.runtime, responder, None, limiter)
        self.routes = JobRoutes(self.runtime, responder, checks)
        self._raw: Any = object()  # the twin document last parsed (never equal at first)
        self.why = "no twin read yet"
        #: answers made here by route kind and status (tests, logs)
        self.answered: dict[tuple[str, int], int] = {}

    @property
    def store(self) -> Any:
        return self.runtime.store

    def start(self) -> None:
        self.runtime.start_store()

    def stop(self) -> defer.Deferred[Any] | None:
        return self.runtime.close_store()

    def use_twin(self, raw: Any) -> bool:
        """Take the twin document ``raw`` (parsed only when it changed); whether the
        model can be validated here now."""
        from mortred_twisted.runtime.model_runtime import Readiness

        if raw == self._raw:
            return self.runtime.ready
        self._raw = raw
        parsed = parse_twin(raw, self.config)
        rt = self.runtime
        if parsed.twin is None:
            rt.models, rt.readiness = [], Readiness.LOADING
            if parsed.why != self.why:
                log.info("admission at zero for {id}: holding instead ({why})",
                         id=self.config.id, why=parsed.why)  # fmt: skip
            self.why = parsed.why
            return False
        rt.models, rt.readiness = [parsed.twin], Readiness.READY
        self.why = ""
        log.info("admission at zero for {id}: validating with the published twin",
                 id=self.config.id)  # fmt: skip
        return True

    def handle(self, route: Route, headers: Mapping[bytes, list[bytes]], body: bytes | None) -> Any:
        """Run the route's model-port handler on a :class:`LocalRequest`; a Deferred of
        :class:`LocalResponse` (or the response itself)."""
        method = b"POST" if route.kind is RouteKind.SUBMIT else b"GET"
        request = LocalRequest(method, route.upstream_path.encode("latin-1"), headers, body)
        args = () if route.job_id is None else (route.job_id,)
        handler = getattr(self.routes, HANDLERS[route.kind])
        label = route.kind.value

        def answer(out: bytes) -> LocalResponse:
            key = (label, request.code)
            self.answered[key] = self.answered.get(key, 0) + 1
            return request.answer(out)

        return defer.maybeDeferred(handler, request, *args).addCallback(answer)


class ColdAdmission:
    """Every autoscaled Redis-store id's :class:`HeadlessJobs` (see the module
    docstring). Reactor thread only."""

    def __init__(self, models: Mapping[str, HeadlessJobs]) -> None:
        self.models = dict(models)

    @classmethod
    def for_catalog(
        cls,
        catalog: Catalog,
        clock: IReactorTime,
        internal_token: str = "",
        env: Mapping[str, str] | None = None,
    ) -> ColdAdmission | None:
        """The admission of ``catalog``'s autoscaled ids on the Redis store with async
        jobs on (None when there is none); an id whose server file cannot be read is
        left to hold-and-forward (logged)."""
        models: dict[str, HeadlessJobs] = {}
        environ = os.environ if env is None else env
        for entry in catalog.values():
            if not admits(entry):
                continue
            try:
                config = load_server_config(entry.config_path, env=environ)
            except (ConfigErrors, OSError) as exc:
                log.warn("admission at zero for {id}: off ({e})", id=entry.id, e=exc)
                continue
            if config.job_store != "redis" or not config.async_enabled:
                continue
            if internal_token:  # what the supervisor gives its child (MORTRED_AUTH_TOKEN)
                config = replace(config, auth_token=internal_token)
            models[entry.id] = HeadlessJobs(config, clock)
        return cls(models) if models else None

    def start(self) -> None:
        for jobs in self.models.values():
            jobs.start()

    def stop(self) -> defer.Deferred[Any]:
        stops = [d for d in (j.stop() for j in self.models.values()) if d is not None]
        return defer.DeferredList(stops, consumeErrors=True)

    def serve(
        self, route: Route, headers: Mapping[bytes, list[bytes]], body: bytes | None
    ) -> defer.Deferred[LocalResponse | None] | None:
        """The answer to ``route`` made here, or None (at once, or as the Deferred's
        result) when the gateway should hold it instead (see the module docstring)."""
        jobs = self.models.get(route.entry.id)
        if jobs is None or route.kind not in HANDLERS:
            return None
        link = jobs.store.link
        if not link.connected:
            return None
        if route.kind is not RouteKind.SUBMIT:
            return jobs.handle(route, headers, body)
        read = link.call("GET", twin_key(jobs.config.id))

        def admit(raw: Any) -> Any:
            if not jobs.use_twin(raw):
                return None
            return jobs.handle(route, headers, body)

        def unreadable(failure: Any) -> None:
            log.warn("admission at zero for {id}: twin unreadable ({e}); holding",
                     id=jobs.config.id, e=failure.getErrorMessage())  # fmt: skip
            return None

        return read.addCallbacks(admit, unreadable)


def admits(entry: CatalogEntry) -> bool:
    """Whether ``entry`` may be admitted here: autoscaled, on the Redis store, with
    async jobs and a server file the gateway can read."""
    return (
        entry.autoscale is not None
        and entry.job_store == "redis"
        and entry.async_enabled
        and bool(entry.config_path)
    )
