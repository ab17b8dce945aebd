"""The client's exceptions, and the one table that maps an HTTP answer to them (pure).

Every error the server answered carries its HTTP ``status``, the business ``code``
of the body (``{"error", "code"}`` on job routes, ``{"code", "msg"}`` in a sync
envelope, ``{"error"}`` from the gateway; ``None`` when absent), the ``message``
and the decoded ``body``. :func:`error_for` picks the class; the clients raise it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mortred_client.types import JobStatus


class MortredError(Exception):
    """Base of every error this client raises."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: int | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}" if self.status else self.message


class TransportError(MortredError):
    """The server could not be reached, or the connection broke before an answer
    (after the retries the request was allowed)."""


class InvalidRequest(MortredError):
    """400, 413, 415 or 422: the request itself is wrong; retrying cannot help."""


class Unauthorized(MortredError):
    """401: missing or wrong token."""


class Forbidden(MortredError):
    """403: the token is valid but its scope does not allow this route."""


class NotFound(MortredError):
    """404: no such route or model."""


class JobNotFound(NotFound):
    """404 on a job route: unknown id, or forgotten by retention."""


class NotSupported(NotFound):
    """The server has no such route (404/405 on an optional one, such as the queue)."""


class Conflict(MortredError):
    """409: the job is not in a state for this request."""


class JobNotFinished(Conflict):
    """409 from ``/result``: the job is still pending or running."""


class JobAlreadyFinished(Conflict):
    """409 from a cancel: the job had already ended."""


class QueueFull(MortredError):
    """429: queue full, backpressure or rate limit. ``retry_after`` is the server's
    ``Retry-After`` in seconds (``None`` when absent or unreadable)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(MortredError):
    """5xx: the model or the gateway failed (502/503/504 after the retries allowed)."""


class JobFailed(MortredError):
    """The job ended without a result (``failed``, ``timeout`` or ``cancelled``);
    ``job`` is its final status, ``state`` and ``message`` say how it ended."""

    def __init__(self, job: JobStatus) -> None:
        message = f"job {job.job_id} ended {job.state}" + (f": {job.error}" if job.error else "")
        super().__init__(message, body=job.raw)
        self.job = job
        self.state = job.state
        self.error = job.error


def decode_body(raw: bytes) -> Any:
    """A body as JSON when it is JSON, else as text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def error_for(
    status: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    on_job: bool = False,
    what: str = "",
    retry_after: float | None = None,
) -> MortredError:
    """The exception for an error answer (``status >= 400``).

    ``on_job``: the request named a job (a 404 is :class:`JobNotFound`); ``what``:
    ``"result"`` or ``"cancel"`` for the two 409s, ``"optional"`` for a route the
    server may not have (404/405 are :class:`NotSupported`).
    """
    doc = decode_body(body)
    message = ""
    code = None
    if isinstance(doc, dict):
        message = str(doc.get("error") or doc.get("msg") or "")
        raw_code = doc.get("code")
        code = raw_code if isinstance(raw_code, int) else None
    elif isinstance(doc, str):
        message = doc.strip()[:500]
    message = message or f"HTTP {status}"
    kw: dict[str, Any] = {"status": status, "code": code, "body": doc, "headers": headers}
    if what == "optional" and status in (404, 405):
        return NotSupported(message, **kw)
    if status == 401:
        return Unauthorized(message, **kw)
    if status == 403:
        return Forbidden(message, **kw)
    if status == 404:
        return JobNotFound(message, **kw) if on_job else NotFound(message, **kw)
    if status == 409:
        if what == "result":
            return JobNotFinished(message, **kw)
        if what == "cancel":
            return JobAlreadyFinished(message, **kw)
        return Conflict(message, **kw)
    if status == 429:
        return QueueFull(message, retry_after=retry_after, **kw)
    if status >= 500:
        return ServerError(message, **kw)
    return InvalidRequest(message, **kw)
