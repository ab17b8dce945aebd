"""``multipart/form-data`` submits (RFC 7578), parsed from a body already in memory (pure).

A submit may carry its inputs as form parts instead of JSON, so large files travel as
bytes, not base64: one part per file input (``filename`` set, its own
``Content-Type``), the other inputs as text fields, and optionally a ``params`` part
holding a JSON object (merged under the fields) and the envelope's ``req_id``,
``webhook``, ``webhook_events_filter`` and ``priority`` as fields. Repeating a name
makes a list (``images`` parts fill the seed envelope's images).

The body has already passed the port's size limit (checked from the head); the parser
bounds what it keeps and does, while it scans: at most :data:`MAX_PARTS` parts
(refused at the first part beyond, never after splitting the whole body), each head
at most :data:`MAX_PART_HEAD` bytes, each name at most :data:`MAX_NAME` characters;
each part's content is copied once. Problems raise
:class:`~mortred_twisted.http.errors.ApiError` (422, code 52) naming what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mortred_twisted.http.errors import INVALID_REQUEST, JSON_DECODE_ERROR, ApiError
from mortred_twisted.sdk.validation import Upload

MAX_PARTS = 256
MAX_PART_HEAD = 8192
MAX_BOUNDARY = 70  # RFC 2046
#: longest part name (a field or an input's name)
MAX_NAME = 200

_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')


def _invalid(message: str) -> ApiError:
    return ApiError(INVALID_REQUEST, f"invalid request: multipart: {message}")


def header_params(value: str) -> tuple[str, dict[str, str]]:
    """``type; a=b; c="d"`` → ("type", {"a": "b", "c": "d"}) (names lower-cased)."""
    main, _, rest = value.partition(";")
    params = {}
    for m in _PARAM.finditer(";" + rest):
        raw = m.group(2)
        if raw.startswith('"'):
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        params[m.group(1).lower()] = raw
    return main.strip().lower(), params


def is_multipart(content_type: str | None) -> bool:
    return bool(content_type) and content_type.split(";", 1)[0].strip().lower() == (
        "multipart/form-data"
    )


def boundary_of(content_type: str) -> bytes:
    _, params = header_params(content_type)
    boundary = params.get("boundary", "")
    if not boundary or len(boundary) > MAX_BOUNDARY:
        raise _invalid("Content-Type needs a boundary of 1 to 70 characters")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise _invalid("the boundary must be ASCII") from None


@dataclass
class FormSubmit:
    """What a multipart body carried: text fields and file parts by name (repeated
    names keep every value, in order)."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[Upload]] = field(default_factory=dict)


def _part_spans(body: bytes, delimiter: bytes) -> list[tuple[int, int]]:
    """Where each part lies in ``body`` (between two delimiters), found by scanning
    (``bytes.find``, no copy): refused as soon as a part beyond :data:`MAX_PARTS`
    shows, so a flood of tiny parts costs no more than :data:`MAX_PARTS` of them."""
    first = body.find(delimiter)
    if first < 0:
        raise _invalid("the body does not end with the closing boundary")
    step = len(delimiter)
    spans: list[tuple[int, int]] = []
    at = first + step
    while (nxt := body.find(delimiter, at)) >= 0:
        spans.append((at, nxt))
        if len(spans) > MAX_PARTS:
            raise _invalid(f"at most {MAX_PARTS} parts")
        at = nxt + step
    if not spans or not body.startswith(b"--", at):
        raise _invalid("the body does not end with the closing boundary")
    return spans


def parse_form(body: bytes, content_type: str) -> FormSubmit:
    """Split ``body`` into its parts (see the module docstring). Bounded while it
    scans: the part count (:func:`_part_spans`) and each part's head (at most
    :data:`MAX_PART_HEAD` bytes, and field names at most :data:`MAX_NAME`) are
    checked before anything of the part is copied; each part's content is copied
    once (together never more than the body)."""
    delimiter = b"--" + boundary_of(content_type)
    out = FormSubmit()
    for index, (start, end) in enumerate(_part_spans(body, delimiter)):
        if not body.startswith(b"\r\n", start) or end - start < 2 or body[end - 2 : end] != b"\r\n":
            raise _invalid(f"part {index}: not framed by CRLF")
        inner, stop = start + 2, max(start + 2, end - 2)
        blank = body.find(b"\r\n\r\n", inner, stop)
        if blank >= 0:
            head_end, content_at = blank, blank + 4
        elif body.startswith(b"\r\n", inner) and inner + 2 <= stop:  # no headers at all
            head_end, content_at = inner, inner + 2
        else:
            raise _invalid(f"part {index}: no blank line after its headers")
        if head_end - inner > MAX_PART_HEAD:
            raise _invalid(f"part {index}: headers over {MAX_PART_HEAD} bytes")
        head = body[inner:head_end]
        headers: dict[str, str] = {}
        for line in head.split(b"\r\n") if head else ():
            name, colon, value = line.partition(b":")
            if not colon:
                raise _invalid(f"part {index}: malformed header line")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode(
                "utf-8", "replace"
            )
        content = body[content_at:stop]
        disposition, params = header_params(headers.get("content-disposition", ""))
        if disposition != "form-data" or not params.get("name"):
            raise _invalid(f"part {index}: needs Content-Disposition: form-data; name=...")
        name = params["name"]
        if len(name) > MAX_NAME:
            raise _invalid(f"part {index}: a name over {MAX_NAME} characters")
        if "filename" in params or ("content-type" in headers and not _is_text(headers)):
            upload = Upload(
                data=content,
                content_type=headers.get("content-type") or None,
                filename=params.get("filename") or None,
            )
            out.files.setdefault(name, []).append(upload)
        else:
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid(f"field {name!r} is not UTF-8 text") from None
            out.fields.setdefault(name, []).append(text)
    return out


def _is_text(headers: dict[str, str]) -> bool:
    main, _ = header_params(headers.get("content-type", "text/plain"))
    return main.startswith("text/") or main == "application/json"


ENVELOPE_FIELDS = ("req_id", "webhook", "webhook_events_filter", "priority")


def form_envelope(form: FormSubmit) -> tuple[dict[str, Any], dict[str, Any], list[Upload]]:
    """(envelope fields, params, images) of a parsed form: the ``params`` part (a JSON
    object) under the named fields, each field one value or, repeated, a list."""
    envelope: dict[str, Any] = {}
    for name in ENVELOPE_FIELDS:
        values = form.fields.pop(name, None)
        if values is None:
            continue
        if len(values) != 1:
            raise _invalid(f"field {name!r} given {len(values)} times")
        value: Any = values[0]
        if name in ("webhook_events_filter",):
            value = [v.strip() for v in value.split(",") if v.strip()]
        envelope[name] = value
    params: dict[str, Any] = {}
    raw_params = form.fields.pop("params", None)
    if raw_params is not None:
        if len(raw_params) != 1:
            raise _invalid("the params part is given more than once")
        try:
            doc = json.loads(raw_params[0])
        except json.JSONDecodeError as exc:
            raise ApiError(JSON_DECODE_ERROR, f"json decode error in params: {exc}") from None
        if not isinstance(doc, dict):
            raise _invalid("the params part must be a JSON object")
        params.update(doc)
    images = form.files.pop("images", [])
    for name, values in form.fields.items():
        if name in params:
            raise _invalid(f"{name!r} is given both as a field and in params")
        params[name] = values[0] if len(values) == 1 else values
    for name, uploads in form.files.items():
        if name in params:
            raise _invalid(f"{name!r} is given both as a file part and as a field")
        params[name] = uploads[0] if len(uploads) == 1 else uploads
    return envelope, params, images
