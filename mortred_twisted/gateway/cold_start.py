"""Cold starts: the gateway holds requests for an autoscaled id with no replica up
(reactor thread).

When every upstream of an autoscaled model id refused the connection (its
replicas were scaled to zero, or are still starting), the gateway does not answer
503 at once. A submit, poll, wait or result it can answer itself from the shared
Redis store is answered there (:mod:`~mortred_twisted.http.gateway_admission`: a submit
is admitted at once, validated with the model's validation twin, and its 202 says
so; :meth:`ColdStart.nudge` then asks the supervisor for a replica without holding
anything). Any other request, and a submit the admission cannot take (no usable
twin: a model whose validation is code, a twin not published yet or published with
other settings; Redis not reached), is held: the gateway asks the supervisor to
start a replica (``POST /api/v1/autoscale/<id>/wake``, one call per held request:
the supervisor counts them as load, so a burst that arrives at zero starts the
replicas it needs, not one) and forwards the request to the replica the answer
names, once it is ready. A submit held this way gets its 202 when the first replica
is up and has admitted it; the body was read before the first try, so nothing is
sent twice. After a wake came back without a replica (:attr:`ColdStart.
unstartable`: an operator's stop, shutdown, a start past the timeout) submits are
held again, not admitted, until a wake finds one.

**Bounds**, per id (``[servers.<id>]``): at most ``cold_start_max_waiting``
requests held at once, each for at most ``cold_start_timeout_s`` (jobs admitted at
zero are not held: they wait in the store, within ``async_timeout``). Beyond either,
or when the supervisor refuses (operator stop, shutdown) or cannot be reached, the
request is answered 503 with ``Retry-After``: the replica start-up time the
supervisor measured (its last answer's ``startup_s``; before any was measured, the
timeout). A replica's own "not ready" 503 (it is starting, or draining after
the scaler stopped it) counts as a refused connection (:meth:`ColdStart.
refuse_not_ready`). A request is held once: its retry, and the retries that follow a refused
connection from it, are marked (:data:`HELD`) and end like any other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.config.catalog import Catalog
from mortred_twisted.gateway.routing import Route
from mortred_twisted.http11.upstream import UpstreamUnavailable

log = Logger()

#: What a model server's 503 says when it is not ready (starting, or draining at a
#: stop: its error code 65 in both the envelope and the job-route body).
NOT_READY = b'"code":65'

#: Carried in a retried route's ``tried`` set (never a URL, so ``pick`` ignores it):
#: that request was held once already.
HELD = "cold-start:held"


@dataclass(frozen=True)
class Woken:
    """The supervisor's answer to a wake: a ready replica's base URL (None: none
    within its bound, or refused), and the measured start-up time, if known."""

    url: str | None
    startup_s: float | None = None


Wake = Callable[[str], "defer.Deferred[Woken]"]


class ColdStart:
    """The held requests of every autoscaled id this gateway routes."""

    def __init__(self, catalog: Catalog, wake: Wake, clock: IReactorTime) -> None:
        self.settings = {e.id: e.autoscale for e in catalog.values() if e.autoscale is not None}
        self._wake = wake
        self._clock = clock
        self.waiting: dict[str, int] = dict.fromkeys(self.settings, 0)
        self.held = 0
        self.refused = 0
        #: jobs admitted by the gateway itself at zero replicas (http/gateway_admission.py)
        self.admitted = 0
        self._startup_s: dict[str, float] = {}
        self._nudging: set[str] = set()
        #: ids whose last wake found no replica (an operator's stop, the supervisor
        #: shutting down or unreachable, a start past the timeout): their submits
        #: are held (and refused as before) until a wake finds one, never admitted
        #: here into a store no replica may ever read
        self.unstartable: set[str] = set()

    def covers(self, route: Route) -> bool:
        """True for a route of an autoscaled id not held before."""
        return route.entry.id in self.settings and HELD not in route.tried

    def refuse_not_ready(self, response: Any, route: Route) -> Any:
        """A callback on an upstream answer: a "not ready" 503 of an autoscaled id's
        replica (one starting, or draining after the scaler stopped it) raises
        :class:`UpstreamUnavailable`, like a refused connection, so the request goes
        to another replica or is held (the model admitted nothing: safe for a
        submit too). Any other answer passes."""
        if (
            response.code == 503
            and route.entry.id in self.settings
            and NOT_READY in response.body[:200]
        ):
            raise UpstreamUnavailable(f"replica not ready ({route.base or route.entry.base_url})")
        return response

    def retry_after_s(self, model_id: str) -> int:
        settings = self.settings[model_id]
        startup = self._startup_s.get(model_id, settings.cold_start_timeout_s)
        return max(1, math.ceil(startup))

    def hold(
        self,
        route: Route,
        retry: Callable[[Route], defer.Deferred[bytes]],
        refuse: Callable[[str, int], bytes],
    ) -> defer.Deferred[bytes]:
        """Hold ``route``'s request until a replica is ready, then ``retry`` it there;
        ``refuse(message, retry_after_s)`` renders the 503 beyond the bounds. The
        Deferred fires with the body to send; cancelling it (the client left)
        releases the place."""
        model_id = route.entry.id
        settings = self.settings[model_id]
        if self.waiting[model_id] >= settings.cold_start_max_waiting:
            self.refused += 1
            message = f"{model_id}: starting; {self.waiting[model_id]} requests already wait"
            return defer.succeed(refuse(message, self.retry_after_s(model_id)))
        self.waiting[model_id] += 1
        self.held += 1
        released = [False]
        call = self._call(model_id)

        def release() -> None:
            if not released[0]:
                released[0] = True
                self.waiting[model_id] -= 1
            if not call.called:  # the supervisor stops counting this request
                call.cancel()

        held: defer.Deferred[Woken] = defer.Deferred(lambda _d: release())
        call.addCallback(lambda w: None if held.called or released[0] else held.callback(w))
        timer = self._clock.callLater(
            settings.cold_start_timeout_s,
            lambda: held.callback(Woken(None)) if not held.called else None,
        )

        def woken(w: Woken) -> Any:
            release()
            if timer.active():
                timer.cancel()
            if w.url is None:
                self.refused += 1
                message = f"{model_id}: no replica ready yet (starting one)"
                return refuse(message, self.retry_after_s(model_id))
            again = Route(
                route.kind,
                route.entry,
                route.upstream_path,
                route.job_id,
                w.url,
                route.upstreams,
                frozenset({HELD}),
            )
            return retry(again)

        def cancelled(failure: Any) -> Any:
            release()
            if timer.active():
                timer.cancel()
            return failure

        held.addCallbacks(woken, cancelled)
        return held

    def nudge(self, model_id: str) -> None:
        """A job of ``model_id`` was admitted here with no replica up: ask the
        supervisor to start one without holding anything (one wake per id in flight
        at a time: the admitted jobs are already in the backlog it scales on)."""
        self.admitted += 1
        if model_id in self._nudging:
            return
        self._nudging.add(model_id)
        self._call(model_id).addBoth(lambda _w: self._nudging.discard(model_id))

    def _call(self, model_id: str) -> defer.Deferred[Woken]:
        """This held request's wake call (never fails: a failure is ``Woken(None)``)."""
        call = self._wake(model_id)

        def done(w: Any) -> Woken:
            if isinstance(w, Failure) and w.check(defer.CancelledError):
                return Woken(None)  # the client left: says nothing about the model
            if not isinstance(w, Woken):
                log.warn("cold start {id}: wake failed: {why}", id=model_id, why=w)
                w = Woken(None)
            if w.startup_s is not None:
                self._startup_s[model_id] = w.startup_s
            if w.url is None:
                self.unstartable.add(model_id)
            else:
                self.unstartable.discard(model_id)
            return w

        return call.addBoth(done)


class WakeLog:
    """Logs why wake calls fail: each new cause once, then how often it repeated
    when the cause changes or the calls succeed again (a burst of held requests
    against an unreachable supervisor is one line, not one per request)."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.repeats = 0

    def failed(self, model_id: str, cause: str) -> None:
        if cause == self.last:
            self.repeats += 1
            return
        self._flush()
        self.last = cause
        log.warn("cold start {id}: wake failed: {cause}", id=model_id, cause=cause)

    def ok(self) -> None:
        self._flush()
        self.last = None

    def _flush(self) -> None:
        if self.repeats:
            log.warn("(the last wake failure repeated {n} times)", n=self.repeats)
        self.repeats = 0


def supervisor_wake(
    http: Any, api_url: str, internal_token: str, wake_log: WakeLog | None = None
) -> Wake:
    """A :data:`Wake` over HTTP: ``POST <api_url>/api/v1/autoscale/<id>/wake`` with the
    internal token, through ``http`` (an upstream client's ``request``). A call that
    fails (no connection, an answer that is neither a replica nor the supervisor's
    own refusal) is a ``Woken(None)`` whose cause is logged (:class:`WakeLog`)."""
    headers = {b"authorization": [b"Bearer " + internal_token.encode("latin-1")]}
    wake_log = wake_log if wake_log is not None else WakeLog()

    def wake(model_id: str) -> defer.Deferred[Woken]:
        url = f"{api_url}/api/v1/autoscale/{model_id}/wake"
        d = http.request("POST", url, headers, None)

        def read(response: Any) -> Woken:
            try:
                doc = json.loads(response.body)
            except ValueError:
                doc = {}
            if not isinstance(doc, dict):
                doc = {}
            startup = doc.get("startup_s")
            if response.code == 200 and isinstance(doc.get("url"), str):
                wake_log.ok()
                return Woken(doc["url"], startup)
            if response.code != 503:  # 503: the supervisor's own "none ready in time"
                error = doc.get("error") or bytes(response.body[:200]).decode("utf-8", "replace")
                wake_log.failed(model_id, f"POST {url}: HTTP {response.code}: {error}")
            retry = doc.get("retry_after_s")
            return Woken(None, startup if startup is not None else retry)

        def failed(f: Failure) -> Woken:
            if f.check(defer.CancelledError):
                return Woken(None)  # the client left
            wake_log.failed(model_id, f"POST {url}: {f.getErrorMessage() or f.type.__name__}")
            return Woken(None)

        d.addCallback(read)
        d.addErrback(failed)
        return d

    return wake
