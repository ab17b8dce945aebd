"""Job lifecycle events, fanned out on the reactor thread: live event streams and webhooks.

The runner (and the cancel route) report what happens to a job — it started, it made
progress, it ended — and :class:`JobEvents` turns each report into

* a count on the job's *events counter* (``NamedCounters`` name
  :func:`events_counter`), which wakes every ``/jobs/{id}/events`` stream of the job
  (a stream re-reads the job's status and writes what changed: no polling);
* a webhook delivery when the job was submitted with a ``webhook`` whose
  ``webhook_events_filter`` names the event (``start``, ``progress``, ``output``,
  ``completed``; ``output`` carries a streamed output of an SDK model).

Progress reports arrive on worker threads; they hop to the reactor with
``call_from_thread`` and are coalesced (one pending hop per job at a time), so a
model reporting thousands of steps a second costs the reactor at most one wake per
turn. Webhook deliveries never block anything: they are independent Deferred chains
(see :class:`~mortred_twisted.runtime.webhooks.WebhookSender`).

Thread contract: :meth:`progress` may be called from any thread; everything else on
the reactor thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from mortred_twisted.jobs.status import status_doc
from mortred_twisted.jobs.store import JobStore, then
from mortred_twisted.jobs.types import JobSnapshot
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.model_events import ModelEvents
from mortred_twisted.runtime.webhooks import WebhookSender

log = Logger()


def events_counter(job_id: str) -> str:
    """The counter name that wakes a job's event streams (not its ``/wait`` waiters)."""
    return job_id + "#events"


class JobEvents:
    """Reports job lifecycle events to streams and webhooks (see module docstring)."""

    def __init__(
        self,
        *,
        store: JobStore[Any],
        counters: NamedCounters,
        call_from_thread: Callable[..., Any],
        webhooks: WebhookSender | None = None,
    ) -> None:
        self._store = store
        self._counters = counters
        self._call_from_thread = call_from_thread
        self._webhooks = webhooks
        self._hop_lock = threading.Lock()
        self._hops_pending: set[str] = set()
        #: what SDK models emit (previews, streamed outputs), kept for the streams
        self.model = ModelEvents(
            call_from_thread=call_from_thread, wake=self.changed, webhook=self._output_webhook
        )

    # -- reports ------------------------------------------------------------------

    def started(self, job_id: str) -> None:
        """The job went ``pending → running`` here (reactor thread)."""
        self._counters.count_by_name(events_counter(job_id), None)
        self._webhook(job_id, "start", terminal=False)

    def progress(self, job_id: str, step: int, total: int) -> None:
        """The run reported a step (any thread); coalesced into one reactor hop, and
        none at all while no stream follows the job and no webhook may want it (a
        stream that registers later re-reads the status after registering, so it
        misses nothing). The check reads the counter registry's size from the model thread:
        one dict lookup, atomic under the GIL; a stale answer costs one hop or one
        progress event a stream re-reads anyway."""
        if self._webhooks is None and not self._counters.waiting(events_counter(job_id)):
            return
        with self._hop_lock:
            if job_id in self._hops_pending:
                return
            self._hops_pending.add(job_id)
        self._call_from_thread(self._progress_on_reactor, job_id)

    def _progress_on_reactor(self, job_id: str) -> None:
        with self._hop_lock:
            self._hops_pending.discard(job_id)
        self._counters.count_by_name(events_counter(job_id), None)
        self._webhook(job_id, "progress", terminal=False)

    def emitted(self, job_id: str, name: str, data: Any) -> None:
        """A running model emitted an event (any thread; see runtime/model_events.py)."""
        self.model.emit_from_thread(job_id, name, data)

    def _output_webhook(self, job_id: str, name: str, data: Any, seq: int) -> None:
        self._webhook(job_id, name, terminal=False, extra={"output": data, "output_index": seq})

    def changed(self, job_id: str) -> None:
        """Something about the job changed elsewhere (another replica): wake streams."""
        self._counters.count_by_name(events_counter(job_id), None)

    def ended(self, job_id: str) -> None:
        """The job reached a terminal state (reactor thread, after the transition)."""
        self._counters.count_by_name(events_counter(job_id), None)
        self._webhook(job_id, "completed", terminal=True)

    # -- webhooks -----------------------------------------------------------------

    def _webhook(
        self, job_id: str, event: str, *, terminal: bool, extra: dict[str, Any] | None = None
    ) -> None:
        if self._webhooks is None:
            return
        webhooks = self._webhooks
        target = self._store.webhook_of(job_id)

        def deliver(found: tuple[str, frozenset[str]] | None) -> Any:
            if found is None or event not in found[1]:
                return None
            url = found[0]

            def send(snap: JobSnapshot | None) -> Any:
                if snap is None:
                    return None
                doc = status_doc(snap)
                if terminal and snap.state.value == "done":
                    return then(
                        self._store.take_result(job_id),
                        lambda lookup: webhooks.send(
                            job_id, url, event, {**doc, "result": _envelope(lookup)},
                            terminal=True,
                        ),
                    )  # fmt: skip
                if extra:
                    doc = {**doc, **extra}
                return webhooks.send(job_id, url, event, doc, terminal=terminal)

            return then(self._store.snapshot(job_id), send)

        answer = then(target, deliver)
        add_errback = getattr(answer, "addErrback", None)
        if add_errback is not None:
            add_errback(lambda f: log.failure("webhook for {job_id} not sent", f, job_id=job_id))


def _envelope(lookup: Any) -> Any:
    """The result envelope a ``/result`` call would answer, as a dict."""
    if not getattr(lookup, "done", False):
        return None
    data = lookup.result
    if isinstance(data, (bytes, bytearray)):
        data = json.loads(data)
    return {"req_id": lookup.task_id, "code": 0, "msg": "success", "data": data}
