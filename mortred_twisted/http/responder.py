"""Rendering the model port's answers: JSON with the contract's headers, the error
shapes of envelopes (sync path) and job bodies, request ids, and a shared store's
unavailability as 503 (edge, reactor thread only).

Every JSON answer carries ``X-Request-ID``: the ``req_id`` its body names (sync
envelopes, ``/result``), else the request's own ``X-Request-ID``, else a fresh
``req_…`` id; written through :func:`~mortred_twisted.http.answers.header_value`, so
a non-ASCII id cannot break the head (it is percent-encoded).
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from mortred_twisted.http import errors as E
from mortred_twisted.http.answers import REASONS, header_value
from mortred_twisted.http.envelope import new_request_id, render_error
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.protocols.submission import RequestHead
from mortred_twisted.jobs.store import Maybe, StoreUnavailable

JSON_TYPE = b"application/json; charset=utf-8"


def json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def is_json_content_type(value: bytes | None) -> bool:
    """``application/json`` (any charset) or a ``+json`` type."""
    if value is None:
        return False
    mime = value.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or mime.endswith(b"+json")


class Responder:
    """Writes status, headers and body of one answer; stateless, shared by the
    routes of one model server."""

    def headers(self, request: IRequest, req_id: str | None) -> None:
        request.setHeader(b"Content-Type", JSON_TYPE)
        request.setHeader(b"Cache-Control", b"no-store")
        request.setHeader(b"X-Request-ID", header_value(req_id or self.request_id(request)))

    def respond(
        self,
        request: IRequest,
        status: int,
        body: bytes,
        req_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        request.setResponseCode(status, REASONS.get(status))
        self.headers(request, req_id)
        request.setHeader(b"Content-Length", str(len(body)).encode())
        for name, value in (headers or {}).items():
            request.setHeader(name.encode("ascii"), header_value(value))
        return body

    def envelope_error(self, request: IRequest, err: ApiError, req_id: str) -> bytes:
        return self.respond(
            request, err.http_status, render_error(req_id, err.code, err.message), req_id,
            err.headers,
        )  # fmt: skip

    def job_error(self, request: IRequest, err: ApiError, req_id: str | None = None) -> bytes:
        body = json_bytes({"error": err.message, "code": err.code})
        return self.respond(request, err.http_status, body, req_id, err.headers)

    @staticmethod
    def header(request: IRequest, name: bytes) -> bytes | None:
        return request.requestHeaders.getRawHeaders(name, [None])[0]

    @staticmethod
    def head(request: IRequest) -> RequestHead:
        """The request's :class:`RequestHead`, read from its headers once and kept on
        the request (every check and route of one request reads this one)."""
        head: RequestHead | None = getattr(request, "mortred_head", None)
        if head is None:
            head = RequestHead.read(request.requestHeaders)
            request.mortred_head = head  # type: ignore[attr-defined]
        return head

    def request_id_header(self, request: IRequest) -> str | None:
        """The client's ``X-Request-ID`` (cut to 256 characters), None if absent: this
        one header (a poll reads no other; a submit reads its :meth:`head`)."""
        raw = request.requestHeaders.getRawHeaders(b"x-request-id", [None])[0]
        return raw.decode("utf-8", "replace")[:256] if raw else None

    def request_id(self, request: IRequest, head: RequestHead | None = None) -> str:
        """The request's ``X-Request-ID``, else a fresh ``req_…`` id (kept on the
        request so every use in one answer agrees); ``head``: its head when held."""
        rid = getattr(request, "mortred_request_id", None)
        if rid is None:
            rid = (
                head.request_id if head is not None else self.request_id_header(request)
            ) or new_request_id()
            request.mortred_request_id = rid  # type: ignore[attr-defined]
        return rid

    def store_errors(self, request: IRequest, answer: Maybe[bytes], req_id: str | None) -> Any:
        """A store's answer as is, or 503 when the (shared) store is unreachable."""
        if type(answer) is bytes or not isinstance(answer, Deferred):  # bytes: no ABC check
            return answer

        def unavailable(failure: Any) -> bytes:
            failure.trap(StoreUnavailable)
            err = ApiError(E.NOT_READY, str(failure.value), {"Retry-After": "1"})
            return self.job_error(request, err, req_id)

        return answer.addErrback(unavailable)

    def lookup_error(self, request: IRequest, job_id: str) -> bytes:
        err = ApiError(E.NOT_FOUND, f"job not found: {job_id}")
        return self.job_error(request, err, self.request_id_header(request))
