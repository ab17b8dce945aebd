"""Webhook rules (pure): target checks, event filters, signatures, retry policy.

What a job's ``webhook`` may point at, which events it receives, how a delivery is
signed and when a failed delivery is retried. No reactor, no HTTP client: the
delivery itself lives in :mod:`mortred_twisted.runtime.webhooks`.

Signatures follow the Standard Webhooks spec (https://www.standardwebhooks.com):
the signed content is ``"<webhook-id>.<webhook-timestamp>.<body>"``, HMAC-SHA256
with the shared secret, sent as ``webhook-signature: v1,<base64 digest>``. A secret
written ``whsec_<base64>`` (the spec's format) is base64-decoded to its key bytes;
any other secret is used as its UTF-8 bytes.

Targets are deny-by-default: only hosts the operator lists in
``webhook_allowed_hosts`` are accepted, so a client cannot make the server call
into the operator's network (server-side request forgery). The check is on the
URL's host as written; an entry ``host:port`` also pins the port.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

#: Every event a webhook can receive, in the order they happen.
WEBHOOK_EVENTS: tuple[str, ...] = ("start", "progress", "completed")

#: The terminal event's retry policy (Cog's is the floor: 12 attempts, 100 ms doubling).
DEFAULT_ATTEMPTS = 12
DEFAULT_FIRST_DELAY_S = 0.1

#: At most this many progress deliveries a second per job.
PROGRESS_PER_SECOND = 2.0

MAX_URL_LENGTH = 2048


class WebhookRejected(ValueError):
    """A submitted ``webhook`` or ``webhook_events_filter`` is not acceptable (HTTP 422)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def normalise_allowed_hosts(entries: Iterable[str]) -> frozenset[str]:
    """Lower-cased ``host`` or ``host:port`` entries (IPv6 literals in brackets)."""
    return frozenset(e.strip().lower() for e in entries if e.strip())


def check_target(url: object, allowed_hosts: frozenset[str]) -> str:
    """Return ``url`` if it is an absolute http(s) URL to an allowed host.

    Raises :class:`WebhookRejected` naming what is wrong. Credentials in the URL
    and fragments are refused: a delivery carries no secrets but the signature.
    """
    if not isinstance(url, str) or not url:
        raise WebhookRejected("webhook", "must be a non-empty string (an http(s) URL)")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRejected("webhook", f"longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise WebhookRejected("webhook", "contains spaces, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRejected("webhook", f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookRejected("webhook", "must be an absolute http:// or https:// URL")
    if not parts.hostname:
        raise WebhookRejected("webhook", "has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookRejected("webhook", "must not carry credentials")
    if parts.fragment:
        raise WebhookRejected("webhook", "must not have a #fragment")
    host = parts.hostname.lower()
    shown = f"[{host}]" if ":" in host else host
    effective_port = port if port is not None else (443 if parts.scheme == "https" else 80)
    if shown not in allowed_hosts and f"{shown}:{effective_port}" not in allowed_hosts:
        raise WebhookRejected(
            "webhook",
            f"host {shown!r} is not in the server's webhook_allowed_hosts"
            + (" (none are allowed: webhooks are off)" if not allowed_hosts else ""),
        )
    return url


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
