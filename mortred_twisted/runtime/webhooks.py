"""Webhook delivery from the reactor: signed POSTs, retried with jittered backoff.

One :class:`WebhookSender` per model server. Each delivery is its own Deferred
chain, never chained to a job's series or a request: a slow or dead receiver
cannot hold a worker, a waiter or the terminal transition. The rules (targets,
signatures, retry policy, throttling) are pure and live in
:mod:`mortred_twisted.jobs.webhooks`; the client that may only reach admitted
addresses is :mod:`mortred_twisted.runtime.webhook_client`.

Contract:
* reactor thread only;
* a message's ``webhook-id`` names the event (:func:`~mortred_twisted.jobs.webhooks.message_id`:
  ``<job>.start``, ``<job>.progress.<step>``, ``<job>.completed``), so it is the same
  across retries, across replicas and across re-runs of the job, and a receiver can
  deduplicate; each attempt is signed with a fresh ``webhook-timestamp``;
* waits between retries are the policy's delays with equal jitter (each in
  [delay/2, delay], drawn from the injected ``random``);
* at most ``max_inflight`` messages are in flight (sending or waiting to retry), and at
  most ``max_inflight_per_host`` to one host (the URL's host and port); a message over
  either cap is dropped at once;
* redirects are not followed (a 3xx is a failed, non-retried delivery): a
  redirect would otherwise lead past ``webhook_allowed_hosts``;
* a client refusal (:class:`~mortred_twisted.jobs.webhooks.WebhookRejected`: the target or
  every address it resolves to is not admitted, checked again on every attempt) ends the
  message at once;
* the answer's body is read and dropped, at most :data:`MAX_ANSWER_BYTES`;
* logs name a target by origin and path only (:func:`~mortred_twisted.jobs.webhooks.loggable_url`):
  a query string may hold the receiver's token;
* every message ends with exactly one outcome in
  ``mortred_webhook_deliveries_total{event, outcome}``: ``delivered``, ``failed``
  (gave up), ``refused`` (the target may not be reached) or ``dropped`` (a throttled
  progress event, or over an in-flight cap).
"""

from __future__ import annotations

import json
import random as _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.jobs.webhooks import (
    ProgressThrottle,
    WebhookRejected,
    backoff_delays,
    is_retryable,
    jittered,
    loggable_url,
    message_id,
    sign,
)

log = Logger()

MAX_ANSWER_BYTES = 64 * 1024
ATTEMPT_TIMEOUT_S = 10.0

#: Messages in flight at once (sending or waiting to retry), in all and to one host.
MAX_INFLIGHT = 256
MAX_INFLIGHT_PER_HOST = 32

_REFUSED = -1  # an attempt's "status" when the client refused the target


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
        random: Callable[[], float] = _random.random,
        max_inflight: int = MAX_INFLIGHT,
        max_inflight_per_host: int = MAX_INFLIGHT_PER_HOST,
    ) -> None:
        self._clock = clock
        self._client = client
        self._key = key
        self._deliveries = deliveries
        self._delays = tuple(backoff_delays() if delays is None else delays)
        self._attempt_timeout_s = attempt_timeout_s
        self._throttle = throttle or ProgressThrottle()
        self._random = random
        self._max_inflight = max_inflight
        self._max_per_host = max_inflight_per_host
        self._inflight: set[Deferred[str]] = set()
        self._per_host: dict[str, int] = {}
        self._capped: set[str] = set()  # hosts (and "" = all) whose drops were logged

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
        host = _host_key(url)
        msg_id = message_id(job_id, event, status)
        if not self._admit(host, msg_id, event):
            self._count(event, "dropped")
            return defer.succeed("dropped")
        body = json.dumps(dict(status), separators=(",", ":")).encode("utf-8")
        delays = self._delays if terminal else ()
        d = Deferred.fromCoroutine(self._deliver(msg_id, url, event, body, delays))
        self._inflight.add(d)
        self._per_host[host] = self._per_host.get(host, 0) + 1

        def done(outcome: str) -> str:
            self._inflight.discard(d)
            self._capped.discard("")
            left = self._per_host[host] - 1
            if left:
                self._per_host[host] = left
            else:
                del self._per_host[host]
                self._capped.discard(host)
            self._count(event, outcome)
            return outcome

        d.addCallback(done)
        return d

    def _admit(self, host: str, msg_id: str, event: str) -> bool:
        """Whether one more message fits under both in-flight caps (logs a host's first
        drop until its backlog empties, and every global drop)."""
        if len(self._inflight) >= self._max_inflight:
            self._log_first_drop("", msg_id, event, len(self._inflight))
            return False
        if self._per_host.get(host, 0) >= self._max_per_host:
            self._log_first_drop(host, msg_id, event, self._per_host[host])
            return False
        return True

    def _log_first_drop(self, host: str, msg_id: str, event: str, n: int) -> None:
        # One line per episode ("" = the global cap), not one per dropped message.
        if host in self._capped:
            return
        self._capped.add(host)
        log.warn(
            "webhooks{to}: {n} messages in flight, the {which} cap; dropping new ones "
            "until some end (first dropped: {msg_id}, {event})",
            to=f" to {host}" if host else "", n=n,
            which="per-host" if host else "global", msg_id=msg_id, event=event,
        )  # fmt: skip

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
            if status == _REFUSED:
                return "refused"
            if not is_retryable(status) or attempt >= len(delays):
                log.warn(
                    "webhook {msg_id} ({event}) to {url} failed after {n} attempt(s): {why}",
                    msg_id=msg_id,
                    event=event,
                    url=loggable_url(url),
                    n=attempt + 1,
                    why="connection error" if status is None else f"HTTP {status}",
                )
                return "failed"
            await _sleep(self._clock, jittered(delays[attempt], self._random()))
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
        except WebhookRejected as exc:
            log.warn(
                "webhook {msg_id} to {url} refused: {why}", msg_id=msg_id, url=loggable_url(url),
                why=exc.message,
            )  # fmt: skip
            return _REFUSED
        except Exception:
            return None
        return int(response.code)


def _host_key(url: str) -> str:
    """The host a message counts against: the URL's host and port as written."""
    try:
        parts = urlsplit(url)
        return f"{(parts.hostname or '').lower()}:{parts.port or parts.scheme}"
    except ValueError:
        return url


def _sleep(clock: IReactorTime, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    clock.callLater(seconds, d.callback, None)
    return d
