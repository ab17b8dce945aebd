"""Webhook delivery from the reactor: signed POSTs, retried with exponential backoff.

One :class:`WebhookSender` per model server. Each delivery is its own Deferred
chain, never chained to a job's series or a request: a slow or dead receiver
cannot hold a worker, a waiter or the terminal transition. The rules (targets,
signatures, retry policy, throttling) are pure and live in
:mod:`mortred_twisted.jobs.webhooks`.

Contract:
* reactor thread only;
* a message keeps one ``webhook-id`` (``<job_id>.<n>``, ``n`` counting that job's
  messages) across its retries, so a receiver can deduplicate; each attempt is
  signed with a fresh ``webhook-timestamp``;
* redirects are not followed (a 3xx is a failed, non-retried delivery): a
  redirect would otherwise lead past ``webhook_allowed_hosts``;
* the answer's body is read and dropped, at most :data:`MAX_ANSWER_BYTES`;
* every message ends with exactly one outcome in
  ``mortred_webhook_deliveries_total{event, outcome}``: ``delivered``, ``failed``
  (gave up or refused) or ``dropped`` (a throttled progress event).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.jobs.webhooks import (
    ProgressThrottle,
    backoff_delays,
    is_retryable,
    sign,
)

log = Logger()

MAX_ANSWER_BYTES = 64 * 1024
ATTEMPT_TIMEOUT_S = 10.0


class WebhookHttpClient(Protocol):
    """What the sender needs of ``treq.client.HTTPClient``."""

    def post(self, url: str, **kwargs: Any) -> Deferred[Any]: ...


class OutcomeCounter(Protocol):
    """A labelled counter (``prometheus_client.Counter`` with labels event, outcome)."""

    def labels(self, *values: str, **kv: str) -> Any: ...


class _Drain(TwistedProtocol):
    """Reads an answer's body and drops it, stopping after ``MAX_ANSWER_BYTES``."""

    def __init__(self, finished: Deferred[None]) -> None:
        self._finished = finished
        self._seen = 0

    def dataReceived(self, data: bytes) -> None:
        self._seen += len(data)
        if self._seen > MAX_ANSWER_BYTES and self.transport is not None:
            self.transport.stopProducing()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if not self._finished.called:
            self._finished.callback(None)


def _drain(response: Any) -> Deferred[None]:
    finished: Deferred[None] = Deferred()
    response.deliverBody(_Drain(finished))
    return finished


class WebhookSender:
    """Signs and sends job events to their webhook URLs."""

    def __init__(
        self,
        *,
        clock: IReactorTime,
        client: WebhookHttpClient,
        key: bytes | None,
        deliveries: OutcomeCounter | None = None,
        delays: Sequence[float] | None = None,
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S,
        throttle: ProgressThrottle | None = None,
    ) -> None:
        self._clock = clock
        self._client = client
        self._key = key
        self._deliveries = deliveries
        self._delays = tuple(backoff_delays() if delays is None else delays)
        self._attempt_timeout_s = attempt_timeout_s
        self._throttle = throttle or ProgressThrottle()
        self._sequence: dict[str, int] = {}
        self._inflight: set[Deferred[str]] = set()

    @property
    def inflight(self) -> int:
        """Messages still being delivered (including ones waiting to retry)."""
        return len(self._inflight)

    def send(
        self,
        job_id: str,
        url: str,
        event: str,
        status: Mapping[str, Any],
        *,
        terminal: bool,
    ) -> Deferred[str]:
        """Deliver one event; fires with its outcome, never fails.

        ``terminal`` events are retried on connection errors, 429 and 5xx;
        others are sent once, and ``progress`` events are throttled per job.
        """
        if event == "progress" and not self._throttle.allow(job_id, self._clock.seconds()):
            self._count(event, "dropped")
            return defer.succeed("dropped")
        if terminal:
            self._throttle.forget(job_id)
        n = self._sequence.get(job_id, 0) + 1
        if terminal:
            self._sequence.pop(job_id, None)
        else:
            self._sequence[job_id] = n
        body = json.dumps(dict(status), separators=(",", ":")).encode("utf-8")
        delays = self._delays if terminal else ()
        d = Deferred.fromCoroutine(self._deliver(f"{job_id}.{n}", url, event, body, delays))
        self._inflight.add(d)

        def done(outcome: str) -> str:
            self._inflight.discard(d)
            self._count(event, outcome)
            return outcome

        d.addCallback(done)
        return d

    def _count(self, event: str, outcome: str) -> None:
        if self._deliveries is not None:
            self._deliveries.labels(event=event, outcome=outcome).inc()

    async def _deliver(
        self, msg_id: str, url: str, event: str, body: bytes, delays: Sequence[float]
    ) -> str:
        attempt = 0
        while True:
            status = await self._attempt(msg_id, url, body)
            if status is not None and 200 <= status < 300:
                return "delivered"
            if not is_retryable(status) or attempt >= len(delays):
                log.warn(
                    "webhook {msg_id} ({event}) to {url} failed after {n} attempt(s): {why}",
                    msg_id=msg_id,
                    event=event,
                    url=url,
                    n=attempt + 1,
                    why="connection error" if status is None else f"HTTP {status}",
                )
                return "failed"
            await _sleep(self._clock, delays[attempt])
            attempt += 1

    async def _attempt(self, msg_id: str, url: str, body: bytes) -> int | None:
        timestamp = int(self._clock.seconds())
        headers = {
            b"Content-Type": [b"application/json"],
            b"User-Agent": [b"mortred-twisted-webhooks"],
            b"webhook-id": [msg_id.encode("ascii")],
            b"webhook-timestamp": [str(timestamp).encode("ascii")],
        }
        if self._key is not None:
            headers[b"webhook-signature"] = [sign(self._key, msg_id, timestamp, body).encode()]
        try:
            response = await self._client.post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self._attempt_timeout_s,
            )
            await _drain(response)
        except Exception:
            return None
        return int(response.code)


def _sleep(clock: IReactorTime, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    clock.callLater(seconds, d.callback, None)
    return d
