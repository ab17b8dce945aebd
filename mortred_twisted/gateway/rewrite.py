"""Rewriting model-port job URLs to public URLs (pure): the one rewriter of the gateway
(``/v1/models/<id>/jobs/…``) and the supervisor (``/api/v1/jobs/<id>/…``).

A model process answers a submit with ``Location: /jobs/<id>`` and
``poll_url``/``result_url`` under ``/jobs/<id>``; clients of the gateway must see
``/v1/models/<model>/jobs/<id>…`` instead (seed 002, T2). Only values that point at
the model's ``/jobs/`` tree are rewritten (relative, or absolute URLs of any host: the
model port is never a public address); everything else passes unchanged. The same
holds for each job of a listing (``{"jobs": [status…]}``) and for the status JSON in
each ``data:`` line of a job's event stream (:class:`EventRecords`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlsplit

REWRITTEN_FIELDS = ("poll_url", "result_url")


@lru_cache(maxsize=1024)  # model ids come from the catalog: a handful (quote() is slow)
def gateway_prefix(model_id: str) -> str:
    """Where the gateway serves a model's jobs: ``/v1/models/<id>/jobs/``."""
    return f"/v1/models/{quote(model_id, safe='')}/jobs/"


@lru_cache(maxsize=1024)
def supervisor_prefix(server_id: str) -> str:
    """Where the supervisor serves a model's jobs: ``/api/v1/jobs/<id>/``."""
    return f"/api/v1/jobs/{quote(server_id, safe='')}/"


def public_path(value: str, prefix: str) -> str:
    """``/jobs/<rest>`` (or ``http://h:p/jobs/<rest>``) → ``<prefix><rest>``; any
    other value unchanged."""
    path = value
    if "://" in value:
        parts = urlsplit(value)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
    if path.startswith("/jobs/"):
        return prefix + path[len("/jobs/") :]
    return value


def public_job_path(value: str, model_id: str) -> str:
    """:func:`public_path` under the gateway's prefix."""
    return public_path(value, gateway_prefix(model_id))


#: model id -> (compact poll_url key + public prefix, same for result_url, the
#: ``re.sub`` template putting the public prefix after a spaced key).
_REPLACEMENTS: dict[str, tuple[bytes, bytes, bytes]] = {}
_FIELD_PATH = re.compile(rb'("(?:poll_url|result_url)"\s*:\s*")(/jobs/)')


def rewrite_job_urls(body: bytes, model_id: str) -> bytes:
    """:func:`rewrite_urls` under the gateway's prefix."""
    return rewrite_urls(body, gateway_prefix(model_id))


def rewrite_urls(body: bytes, prefix: str) -> bytes:
    """A job body (submit 202, poll/wait 200, cancel 200/202, a listing's
    ``{"jobs": [...]}``) with ``poll_url``/``result_url`` rewritten; byte for byte
    unchanged when it is not a JSON object or holds nothing to rewrite.

    Fast path (every poll pays it): relative ``/jobs/`` values are rewritten in the
    bytes, keeping the rest of the body as the model wrote it. A key quoted inside a
    JSON string is escaped (``\"poll_url\"``) and cannot match. Absolute URLs go
    through the JSON round trip.
    """
    if b"/jobs/" not in body:
        return body
    if b"://" not in body and body.lstrip()[:1] == b"{":
        cached = _REPLACEMENTS.get(prefix)
        if cached is None:
            raw = prefix.encode()
            cached = (
                b'"poll_url":"' + raw,
                b'"result_url":"' + raw,
                rb"\g<1>" + raw.replace(b"\\", b"\\\\"),
            )
            if len(_REPLACEMENTS) < 1024:
                _REPLACEMENTS[prefix] = cached
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
    changed = _rewrite_fields(doc, prefix)
    jobs = doc.get("jobs")
    if isinstance(jobs, list):
        for job in jobs:
            if isinstance(job, dict) and _rewrite_fields(job, prefix):
                changed = True
    if not changed:
        return body
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _rewrite_fields(doc: dict[str, Any], prefix: str) -> bool:
    changed = False
    for name in REWRITTEN_FIELDS:
        value = doc.get(name)
        if isinstance(value, str):
            new = public_path(value, prefix)
            if new != value:
                doc[name] = new
                changed = True
    return changed


_FILE_URL = b'"url":"/jobs/'


def rewrite_file_urls(body: bytes, prefix: str) -> bytes:
    """A result body (``/jobs/{id}/result``) with each result file's ``"url":
    "/jobs/…"`` under ``prefix``. The model server writes compact JSON, and a
    ``"url"`` quoted inside a JSON string is escaped, so a plain replace of the
    compact form finds exactly the files' URLs (``sdk/outputs.py``)."""
    if _FILE_URL not in body:
        return body
    return body.replace(_FILE_URL, b'"url":"' + prefix.encode())


#: Bytes an event stream may hold without a record boundary before they are passed
#: on as they are (the model's records are a few hundred bytes).
MAX_RECORD = 1 << 20


def rewrite_event_data(records: bytes, prefix: str) -> bytes:
    """Complete ``text/event-stream`` records (or whole lines) with each ``data:``
    line's job URLs under ``prefix`` (a line stays one line: JSON never holds a raw
    line break): a status's ``poll_url``/``result_url``, and the result files an SDK
    model's ``preview``/``output`` events describe (``"url"``)."""
    if b"/jobs/" not in records:
        return records
    out = []
    for line in records.splitlines(keepends=True):
        if line.startswith(b"data:"):
            body = line.rstrip(b"\r\n")
            lead = 6 if body.startswith(b"data: ") else 5
            data = rewrite_file_urls(rewrite_urls(body[lead:], prefix), prefix)
            line = body[:lead] + data + line[len(body) :]
        out.append(line)
    return b"".join(out)


class EventRecords:
    """Cuts a job's event stream, as it arrives in arbitrary pieces, at record
    boundaries (a blank line), so that each complete record's ``data:`` lines are
    rewritten whole (:func:`rewrite_event_data`). Pure; one per stream."""

    __slots__ = ("_partial", "_prefix")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        """The complete records in what arrived so far (``b""`` while none is)."""
        if self._partial:
            data = self._partial + data
        lf = data.rfind(b"\n\n")
        crlf = data.rfind(b"\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
        if not end:
            if len(data) > MAX_RECORD:  # not an event stream we know: pass it on
                self._partial = b""
                return data
            self._partial = data
            return b""
        self._partial = data[end:]
        return rewrite_event_data(data[:end], self._prefix)

    def flush(self) -> bytes:
        """What is left when the stream ends (an incomplete record, passed as is)."""
        rest, self._partial = self._partial, b""
        return rest
