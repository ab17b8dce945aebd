"""The wire contract's error table: business code -> HTTP status, in one place.

Routes raise :class:`ApiError` (or domain exceptions mapped by :func:`to_api_error`)
and the model-server app renders them: sync endpoints as the envelope
``{"req_id", "code", "msg", "data": null}``, job endpoints as ``{"error", "code"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mortred_twisted.model_api.base import (
    InputDecodeError,
    InputTooLarge,
    InvalidRequest,
    RunCancelled,
)

SUCCESS = 0
EMPTY_OR_UNDECODABLE_INPUT = 3
MODEL_RUN_TIMEOUT = 4
JSON_DECODE_ERROR = 50
INVALID_REQUEST = 52
UNSUPPORTED_MEDIA_TYPE = 60
ENTITY_TOO_LARGE = 61
METHOD_NOT_ALLOWED = 62
NOT_FOUND = 63
JOB_NOT_FINISHED = 64  # (ours) /jobs/{id}/result before the job is done
NOT_READY = 65
UNAUTHORIZED = 401
MISDIRECTED = 421  # (ours) a Host that is not loopback on a port without a token
TOO_MANY_REQUESTS = 429
INTERNAL_ERROR = 500

#: business code -> HTTP status (codes not listed map to 500)
HTTP_STATUS: dict[int, int] = {
    SUCCESS: 200,
    EMPTY_OR_UNDECODABLE_INPUT: 400,
    MODEL_RUN_TIMEOUT: 504,
    JSON_DECODE_ERROR: 400,
    INVALID_REQUEST: 422,
    UNSUPPORTED_MEDIA_TYPE: 415,
    ENTITY_TOO_LARGE: 413,
    METHOD_NOT_ALLOWED: 405,
    NOT_FOUND: 404,
    JOB_NOT_FINISHED: 409,
    NOT_READY: 503,
    UNAUTHORIZED: 401,
    MISDIRECTED: 421,
    TOO_MANY_REQUESTS: 429,
    INTERNAL_ERROR: 500,
}


def http_status(code: int) -> int:
    return HTTP_STATUS.get(code, 500)


@dataclass
class ApiError(Exception):
    """An error response: business ``code``, message and extra headers."""

    code: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # overrides the table (e.g. job 409)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def http_status(self) -> int:
        return self.status if self.status is not None else http_status(self.code)


def to_api_error(exc: BaseException) -> ApiError:
    """Map a domain exception raised by a model or the runtime to an ApiError."""
    from mortred_twisted.runtime.inference import QueueFull, RunTimeout

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputTooLarge):  # before InvalidRequest, its base class
        return ApiError(ENTITY_TOO_LARGE, f"input too large: {exc}")
    if isinstance(exc, InputDecodeError):  # before InvalidRequest: sdk UnreadableImage is both
        return ApiError(EMPTY_OR_UNDECODABLE_INPUT, f"invalid input: {exc}")
    if isinstance(exc, InvalidRequest):
        return ApiError(INVALID_REQUEST, f"invalid request: {exc}")
    if isinstance(exc, QueueFull):
        return ApiError(TOO_MANY_REQUESTS, str(exc), {"Retry-After": "1"})
    if isinstance(exc, RunTimeout):
        return ApiError(MODEL_RUN_TIMEOUT, str(exc))
    if isinstance(exc, RunCancelled):
        return ApiError(INTERNAL_ERROR, "run cancelled")
    text = str(exc).strip()
    return ApiError(INTERNAL_ERROR, f"model error: {type(exc).__name__}: {text}".rstrip(": "))
