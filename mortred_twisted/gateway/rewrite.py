"""Rewriting model-port job URLs to gateway URLs (pure).

A model process answers a submit with ``Location: /jobs/<id>`` and
``poll_url``/``result_url`` under ``/jobs/<id>``; clients of the gateway must see
``/v1/models/<model>/jobs/<id>…`` instead (seed 002, T2). Only values that point at
the model's ``/jobs/`` tree are rewritten (relative, or absolute URLs of any host: the
model port is never a public address); everything else passes unchanged.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, urlsplit

REWRITTEN_FIELDS = ("poll_url", "result_url")


def public_job_path(value: str, model_id: str) -> str:
    """``/jobs/<rest>`` (or ``http://h:p/jobs/<rest>``) → ``/v1/models/<id>/jobs/<rest>``."""
    path = value
    if "://" in value:
        parts = urlsplit(value)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
    if path.startswith("/jobs/"):
        return f"/v1/models/{quote(model_id, safe='')}{path}"
    return value


#: model id -> (compact poll_url key + public prefix, same for result_url, the
#: ``re.sub`` template putting the public prefix after a spaced key).
_REPLACEMENTS: dict[str, tuple[bytes, bytes, bytes]] = {}
_FIELD_PATH = re.compile(rb'("(?:poll_url|result_url)"\s*:\s*")(/jobs/)')


def rewrite_job_urls(body: bytes, model_id: str) -> bytes:
    """A job body (submit 202, poll/wait 200) with ``poll_url``/``result_url``
    rewritten; byte for byte unchanged when it is not a JSON object or holds nothing
    to rewrite.

    Fast path (every poll pays it): relative ``/jobs/`` values are rewritten in the
    bytes, keeping the rest of the body as the model wrote it. A key quoted inside a
    JSON string is escaped (``\"poll_url\"``) and cannot match. Absolute URLs go
    through the JSON round trip.
    """
    if b"/jobs/" not in body:
        return body
    if b"://" not in body and body.lstrip()[:1] == b"{":
        cached = _REPLACEMENTS.get(model_id)
        if cached is None:
            prefix = f"/v1/models/{quote(model_id, safe='')}/jobs/".encode()
            cached = (
                b'"poll_url":"' + prefix,
                b'"result_url":"' + prefix,
                rb"\g<1>" + prefix.replace(b"\\", b"\\\\"),
            )
            if len(_REPLACEMENTS) < 1024:
                _REPLACEMENTS[model_id] = cached
        # The compact form (what the model server writes) by plain replaces; the
        # regex then only has spaced forms left to find.
        body = body.replace(b'"poll_url":"/jobs/', cached[0])
        body = body.replace(b'"result_url":"/jobs/', cached[1])
        if _FIELD_PATH.search(body) is None:
            return body
        return _FIELD_PATH.sub(cached[2], body)
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body
    if not isinstance(doc, dict):
        return body
    changed = False
    for name in REWRITTEN_FIELDS:
        value = doc.get(name)
        if isinstance(value, str):
            new = public_job_path(value, model_id)
            if new != value:
                doc[name] = new
                changed = True
    if not changed:
        return body
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
