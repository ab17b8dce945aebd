"""``GET /jobs/{id}/events``: a job's live events as server-sent events (edge).

The first event is the job's status when the stream opens; then one event per change
of state, progress or cancel request (``state``, ``progress``, and the terminal
state's name as the last one), a ``ping`` comment every :data:`HEARTBEAT_S` seconds
of silence, and the end of the stream once the job is terminal. Each event's data is
the job's status JSON (as ``GET /jobs/{id}``). Another caller's job is answered as an
unknown id (404), like every job route (:mod:`~mortred_twisted.http.job_routes`).

Thread contract: reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.responder import Responder
from mortred_twisted.http11 import sse
from mortred_twisted.jobs.status import status_body
from mortred_twisted.jobs.store import settle, then
from mortred_twisted.jobs.types import JobSnapshot
from mortred_twisted.runtime.deadline import DeadlineExpired, within
from mortred_twisted.runtime.job_events import events_counter
from mortred_twisted.runtime.model_runtime import Readiness

HEARTBEAT_S = 15.0


class JobEventStream:
    """The events route of one model server. ``prechecks``: the job routes' checks
    (async enabled, credentials); ``visible``: the snapshot if the caller may see
    that job, else None."""

    def __init__(
        self,
        runtime: Any,
        responder: Responder,
        prechecks: Callable[[IRequest], ApiError | None],
        visible: Callable[[IRequest, JobSnapshot | None], JobSnapshot | None],
    ) -> None:
        self.runtime = runtime
        self.responder = responder
        self._prechecks = prechecks
        self._visible = visible

    def job_events(self, request: IRequest, job_id: str) -> Any:
        err = self._prechecks(request)
        if err is not None:
            return self.responder.job_error(request, err)
        rid = self.responder.request_id_header(request)
        first = self.runtime.store.snapshot(job_id)

        def start(snap: JobSnapshot | None) -> Any:
            snap = self._visible(request, snap)
            if snap is None:
                return self.responder.lookup_error(request, job_id)
            return Deferred.fromCoroutine(self._stream(request, job_id, snap, rid))

        return self.responder.store_errors(request, then(first, start), rid)

    async def _stream(
        self, request: IRequest, job_id: str, snap: JobSnapshot, rid: str | None
    ) -> bytes:
        """Write the job's events until it is terminal (or the client leaves: the
        server then cancels this coroutine wherever it waits, a store read included,
        and its wake counter is removed on the way out)."""
        rt = self.runtime
        request.setResponseCode(200)
        self.responder.headers(request, rid)
        request.setHeader(b"Content-Type", sse.CONTENT_TYPE)
        request.setHeader(b"Cache-Control", b"no-cache")
        request.setHeader(b"X-Accel-Buffering", b"no")  # tell proxies not to buffer
        rt.metrics.event_streams.inc()
        seq = 0
        woke: Deferred[str] | None = None
        try:
            request.write(sse.retry(2000))
            seq += 1
            request.write(_event(snap, seq, initial=True))
            last = _key(snap)
            model = rt.events.model
            shown = self._write_model_events(request, job_id, 0)
            # A stopping server ends every stream with the job's current state (the
            # client reconnects elsewhere); a stream opened while stopping ends after
            # its first event.
            while not snap.terminal and rt.readiness is not Readiness.STOPPING:
                woke = rt.counters.counter(events_counter(job_id), 1)
                # Named counters are counted for the terminal event as well; a
                # shared store's events may arrive between the read and the
                # counter, so read again once it is registered.
                again = await settle(rt.store.snapshot(job_id))
                if again is None or _key(again) != last or model.latest(job_id) > shown:
                    woke.addErrback(lambda _f: None)
                    woke.cancel()
                else:
                    try:
                        await within(rt.clock, woke, HEARTBEAT_S, cancel_on_expiry=True)
                    except DeadlineExpired:
                        request.write(sse.comment("ping"))
                        continue
                    again = await settle(rt.store.snapshot(job_id))
                shown = self._write_model_events(request, job_id, shown)
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
            if woke is not None and not woke.called:
                # Left while another await was pending (a store read): the counter
                # would wait for the job's next change, or forever.
                woke.addErrback(lambda _f: None)
                woke.cancel()
        return b""

    def _write_model_events(self, request: IRequest, job_id: str, after: int) -> int:
        """Write the model's events numbered above ``after`` (``preview``, ``output``,
        …: their data is what the model emitted, files described); the last number."""
        for number, name, data in self.runtime.events.model.since(job_id, after):
            request.write(sse.event(name, data, f"m{number}"))
            after = number
        return after


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
