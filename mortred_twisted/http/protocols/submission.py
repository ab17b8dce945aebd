"""The typed submission every front door builds once at the edge (pure: no reactor,
no HTTP objects).

:class:`RequestHead` is what a submit reads from its headers, read once per request
(the request id, the content type, ``Prefer``, ``Idempotency-Key``, the caller's
principal headers): the routes, the checks and the envelope parser take it instead
of looking the same header up again. :class:`Submission` is the job asked for: the
model, the inputs by name (validated by the model's declaration), the caller, the
idempotency key with the fingerprint of the *parsed* request, the priority, the
webhook and how the answer comes back. Immutable; built and used on the reactor
thread, safe to hand to any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from mortred_twisted.model_api.base import InferenceRequest


class RawHeaders(Protocol):
    """What :meth:`RequestHead.read` needs of ``twisted.web.http_headers.Headers``."""

    def getRawHeaders(self, name: bytes) -> Any: ...


MAX_REQUEST_ID_LENGTH = 256


@dataclass(slots=True)
class RequestHead:
    """The headers a submit reads, each looked up once (raw bytes as sent; None when
    absent). ``request_id`` is the client's ``X-Request-ID`` cut to 256 characters
    (None when absent or empty). Treated as immutable (not frozen: a frozen
    dataclass pays a call per field on the hot path)."""

    request_id: str | None
    content_type: bytes | None
    prefer: bytes | None
    idempotency_key: bytes | None
    principal: bytes | None
    principal_scope: bytes | None

    @classmethod
    def read(cls, headers: RawHeaders) -> RequestHead:
        """The head of a request whose headers are ``headers`` (first values)."""
        get = headers.getRawHeaders
        raw_id = (get(b"x-request-id") or _NONE)[0]
        return cls(
            (raw_id.decode("utf-8", "replace")[:MAX_REQUEST_ID_LENGTH] or None) if raw_id else None,
            (get(b"content-type") or _NONE)[0],
            (get(b"prefer") or _NONE)[0],
            (get(b"idempotency-key") or _NONE)[0],
            (get(b"x-mortred-principal") or _NONE)[0],
            (get(b"x-mortred-principal-scope") or _NONE)[0],
        )


_NONE: tuple[None] = (None,)


class Answer(Enum):
    """How the job's answer comes back: ``ASYNC`` a 202 with the job at admission
    (poll, wait, webhook); ``WHEN_DONE`` the door holds the request and answers when
    the job ends (a disconnect cancels the job)."""

    ASYNC = "async"
    WHEN_DONE = "when-done"


@dataclass(slots=True)
class Submission:
    """One job asked for through any door (see the module docstring).

    Treated as immutable. ``inputs`` is validated (``inline_files`` already
    applied); ``fingerprint`` is ``""`` without an ``idempotency_key``, else
    :func:`~mortred_twisted.jobs.idempotency.submission_fingerprint` of the parsed
    request; ``request_id`` names the request (its ``req_id``); ``caller`` owns the
    job (``""``: the port itself)."""

    model_id: str
    inputs: InferenceRequest
    request_id: str
    caller: str
    idempotency_key: str | None
    fingerprint: str
    priority: str
    terms: Any  # CallerTerms of the caller (fair share)
    webhook: tuple[str, frozenset[str]] | None
    inline_files: bool
    answer: Answer = Answer.ASYNC
