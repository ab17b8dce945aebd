"""Webhook rules (pure): target checks, event filters, signatures, retry policy.

What a job's ``webhook`` may point at, which events it receives, how a delivery is
signed and when a failed delivery is retried. No reactor, no HTTP client: the
delivery itself lives in :mod:`mortred_twisted.runtime.webhooks`.

Signatures follow the Standard Webhooks spec (https://www.standardwebhooks.com):
the signed content is ``"<webhook-id>.<webhook-timestamp>.<body>"``, HMAC-SHA256
with the shared secret, sent as ``webhook-signature: v1,<base64 digest>``. A secret
written ``whsec_<base64>`` (the spec's format) is base64-decoded to its key bytes;
any other secret is used as its UTF-8 bytes.

Targets are deny-by-default: what a webhook may reach (the allowlist's grammar, the
address rules) lives in :mod:`mortred_twisted.jobs.webhook_targets`; ``check_target``,
``WebhookRejected`` and ``normalise_allowed_hosts`` are re-exported here.

A message's ``webhook-id`` names the event, not the sender's count
(:func:`message_id`), so every replica and every re-run of a job gives one event the
same id and a de-duplicating receiver keeps exactly one of each.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from mortred_twisted.jobs.webhook_targets import (
    MAX_URL_LENGTH,
    WebhookRejected,
    check_target,
    normalise_allowed_hosts,
)

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_FIRST_DELAY_S",
    "MAX_URL_LENGTH",
    "PROGRESS_PER_SECOND",
    "WEBHOOK_EVENTS",
    "ProgressThrottle",
    "WebhookRejected",
    "backoff_delays",
    "check_target",
    "is_retryable",
    "jittered",
    "message_id",
    "normalise_allowed_hosts",
    "parse_events_filter",
    "secret_key",
    "sign",
    "verify",
]

#: Every event a webhook can receive, in the order they happen.
WEBHOOK_EVENTS: tuple[str, ...] = ("start", "progress", "output", "completed")

#: The terminal event's retry policy (Cog's is the floor: 12 attempts, 100 ms doubling).
DEFAULT_ATTEMPTS = 12
DEFAULT_FIRST_DELAY_S = 0.1

#: At most this many progress deliveries a second per job.
PROGRESS_PER_SECOND = 2.0


def parse_events_filter(value: object) -> frozenset[str]:
    """The events a job's webhook receives (default: all of them)."""
    if value is None:
        return frozenset(WEBHOOK_EVENTS)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebhookRejected(
            "webhook_events_filter", f"must be a list drawn from {list(WEBHOOK_EVENTS)}"
        )
    unknown = sorted(set(value) - set(WEBHOOK_EVENTS))
    if unknown:
        raise WebhookRejected(
            "webhook_events_filter",
            f"unknown event(s) {unknown}; known: {list(WEBHOOK_EVENTS)}",
        )
    if not value:
        raise WebhookRejected("webhook_events_filter", "must name at least one event")
    return frozenset(value)


def secret_key(secret: str) -> bytes:
    """The HMAC key of a configured secret (``whsec_`` base64 form or plain text)."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("webhook_secret: 'whsec_' must be followed by base64") from None
    return secret.encode("utf-8")


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256>``."""
    signed = msg_id.encode("ascii") + b"." + str(timestamp).encode("ascii") + b"." + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(key: bytes, msg_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """Whether any ``v1`` signature in a (space-separated) header matches, in constant time."""
    expected = sign(key, msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in header.split())


def backoff_delays(
    attempts: int = DEFAULT_ATTEMPTS, first_delay_s: float = DEFAULT_FIRST_DELAY_S
) -> Sequence[float]:
    """Seconds to wait before each retry: ``attempts - 1`` delays, doubling."""
    return tuple(first_delay_s * (2**i) for i in range(max(0, attempts - 1)))


def jittered(delay_s: float, draw: float) -> float:
    """``delay_s`` with "equal jitter": ``draw`` in [0, 1) picks a wait in
    [delay_s / 2, delay_s), so retries of many messages failed together spread out."""
    return delay_s * (0.5 + 0.5 * min(max(draw, 0.0), 1.0))


def message_id(job_id: str, event: str, status: Mapping[str, Any]) -> str:
    """The ``webhook-id`` of one event of a job, from what the event reports (the same on
    every replica and every re-run): ``<job>.start``, ``<job>.progress.<step>``,
    ``<job>.output.<n>``, ``<job>.completed`` (a job has one terminal state). Retries keep it."""
    if event == "progress":
        progress = status.get("progress")
        step = progress.get("step", 0) if isinstance(progress, Mapping) else 0
        return f"{job_id}.progress.{step}"
    if event == "output":  # an SDK model's streamed output, numbered per job
        return f"{job_id}.output.{status.get('output_index', 0)}"
    return f"{job_id}.{event}"


def loggable_url(url: str) -> str:
    """``url`` as logs may show it: scheme, host, port and path, as written. The query
    string and fragment (where receivers put tokens) and any user info are dropped; a
    URL that does not parse is not shown at all. Never raises."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    host = parts.netloc.rpartition("@")[2]
    origin = f"{parts.scheme}://{host}" if parts.scheme and host else ""
    return origin + parts.path


def is_retryable(status: int | None) -> bool:
    """A connection error (``None``), 429 or any 5xx is worth another attempt."""
    return status is None or status == 429 or status >= 500


class ProgressThrottle:
    """Lets at most ``per_second`` progress events a second through, per job.

    Not thread-safe: the caller owns it on one thread (the reactor).
    """

    def __init__(self, per_second: float = PROGRESS_PER_SECOND) -> None:
        self._interval = 1.0 / per_second
        self._last: dict[str, float] = {}

    def allow(self, job_id: str, now: float) -> bool:
        last = self._last.get(job_id)
        if last is not None and now - last < self._interval:
            return False
        self._last[job_id] = now
        return True

    def forget(self, job_id: str) -> None:
        self._last.pop(job_id, None)
