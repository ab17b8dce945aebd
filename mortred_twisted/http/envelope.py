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
from mortred_twisted.model_api.base import InferenceRequest

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
    *,
    images_required: bool = True,
) -> InferenceRequest:
    """Parse a request body into an :class:`InferenceRequest` (params not yet validated).

    With ``job_fields`` (a job submit), the job-only fields (:data:`JOB_ONLY_FIELDS`)
    are accepted and moved into it; elsewhere they are unknown fields. Without
    ``images_required`` (a model declared with the SDK: inputs go by name in
    ``params``) an envelope may leave ``images`` out.
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
    elif images_required:
        raise _invalid("images", "required (an array of base64-encoded images)")
    else:
        images = []
    params = doc.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _invalid("params", "must be a JSON object")
    return InferenceRequest(req_id=req_id, images=tuple(images), params=params)


def _request_id(value: Any, header_request_id: str | None) -> str:
    req_id = value if value not in (None, "") else header_request_id or new_request_id()
    if not isinstance(req_id, str):
        raise _invalid("req_id", "must be a string")
    if len(req_id) > MAX_REQ_ID_LEN:
        raise _invalid("req_id", f"must be at most {MAX_REQ_ID_LEN} characters")
    return req_id


def parse_form_envelope(
    body: bytes,
    content_type: str,
    header_request_id: str | None = None,
    job_fields: dict[str, Any] | None = None,
) -> InferenceRequest:
    """A ``multipart/form-data`` submit as an :class:`InferenceRequest` whose params
    are text fields and file parts (see :mod:`mortred_twisted.http.multipart`);
    validated by the model's declaration with ``text_params`` set."""
    from mortred_twisted.http.multipart import form_envelope, is_multipart, parse_form

    if not is_multipart(content_type):
        raise _invalid("body", "content type must be application/json or multipart/form-data")
    envelope, params, uploads = form_envelope(parse_form(body, content_type))
    req_id = _request_id(envelope.pop("req_id", None), header_request_id)
    if envelope:
        if job_fields is None:
            raise _invalid(sorted(envelope)[0], "accepted on a job submit only")
        job_fields.update(envelope)
    if len(uploads) > MAX_IMAGES:
        raise _invalid("images", f"at most {MAX_IMAGES} images per request")
    images = tuple(u.data for u in uploads)
    return InferenceRequest(req_id=req_id, images=images, params=params, text_params=True)


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
