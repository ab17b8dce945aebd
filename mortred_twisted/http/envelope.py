"""Parsing and rendering the request/response envelope (pure; no Twisted).

Request: ``{"req_id"?: str, "images": [base64, ...], "params"?: {...}}``; the legacy
``{"img_data": base64}`` is accepted as one image. A body that is not JSON is a
400 (code 50); JSON that is not a valid envelope is a 422 (code 52) naming the
field. Response: ``{"req_id", "code", "msg", "data"}`` with ``data`` spliced in as
pre-encoded JSON bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mortred_twisted.http.errors import INVALID_REQUEST, JSON_DECODE_ERROR, ApiError
from mortred_twisted.ids import new_request_id
from mortred_twisted.models.base import InferenceRequest

MAX_IMAGES = 64
MAX_REQ_ID_LEN = 256


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(INVALID_REQUEST, f"invalid request: {field}: {message}")


def _b64(field: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise _invalid(field, "must be a base64 string")
    text = value.strip()
    if text.startswith("data:") and "," in text:  # data URL
        text = text.split(",", 1)[1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(field, "is not valid base64") from None
    return raw


#: Envelope fields only a job submit accepts (taken out into ``job_fields``).
JOB_ONLY_FIELDS = ("webhook", "webhook_events_filter", "priority")


def parse_envelope(
    body: bytes,
    header_request_id: str | None = None,
    job_fields: dict[str, Any] | None = None,
) -> InferenceRequest:
    """Parse a request body into an :class:`InferenceRequest` (params not yet validated).

    With ``job_fields`` (a job submit), the job-only fields (:data:`JOB_ONLY_FIELDS`)
    are accepted and moved into it; elsewhere they are unknown fields.
    Raises :class:`ApiError` (400 code 50 / 422 code 52).
    """
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(JSON_DECODE_ERROR, f"json decode error: {exc}") from None
    if not isinstance(doc, dict):
        raise _invalid("body", "must be a JSON object")
    known = {"req_id", "images", "img_data", "params"}
    if job_fields is not None:
        known.update(JOB_ONLY_FIELDS)
        for name in JOB_ONLY_FIELDS:
            if name in doc:
                job_fields[name] = doc[name]
    unknown = sorted(set(doc) - known)
    if unknown:
        raise _invalid(unknown[0], f"unknown field (accepted: {', '.join(sorted(known))})")
    req_id = doc.get("req_id", header_request_id)
    if req_id is None or req_id == "":
        req_id = header_request_id or new_request_id()
    if not isinstance(req_id, str):
        raise _invalid("req_id", "must be a string")
    if len(req_id) > MAX_REQ_ID_LEN:
        raise _invalid("req_id", f"must be at most {MAX_REQ_ID_LEN} characters")
    if "images" in doc and "img_data" in doc:
        raise _invalid("images", "give either images or img_data, not both")
    if "img_data" in doc:
        images = [_b64("img_data", doc["img_data"])]
    elif "images" in doc:
        raw_images = doc["images"]
        if not isinstance(raw_images, list):
            raise _invalid("images", "must be an array of base64 strings")
        if not raw_images:
            raise _invalid("images", "must not be empty")
        if len(raw_images) > MAX_IMAGES:
            raise _invalid("images", f"at most {MAX_IMAGES} images per request")
        images = [_b64(f"images[{i}]", v) for i, v in enumerate(raw_images)]
    else:
        raise _invalid("images", "required (an array of base64-encoded images)")
    params = doc.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _invalid("params", "must be a JSON object")
    return InferenceRequest(req_id=req_id, images=tuple(images), params=params)


def render_success(req_id: str, data_json: bytes) -> bytes:
    """The success envelope with pre-encoded ``data``."""
    return (
        b'{"req_id":'
        + json.dumps(req_id).encode("utf-8")
        + b',"code":0,"msg":"success","data":'
        + data_json
        + b"}"
    )


def render_error(req_id: str, code: int, message: str) -> bytes:
    """The error envelope: ``data`` is null."""
    return json.dumps(
        {"req_id": req_id, "code": code, "msg": message, "data": None},
        separators=(",", ":"),
    ).encode("utf-8")
