"""Idempotent submit (pure): the ``Idempotency-Key`` header's syntax and a request's
fingerprint.

Semantics (IETF httpapi ``Idempotency-Key`` draft, decided in docs/api.md): a key is
1–255 visible ASCII characters; it is remembered, per caller scope, for as long as
the job it created is retained. The same key with the same body (same fingerprint)
replays the original job; the same key with another body is refused (422). The
store that remembers keys decides atomically, so two concurrent submits with one
key create one job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_KEY_LENGTH = 255
HEADER = "Idempotency-Key"


class BadIdempotencyKey(ValueError):
    """The header is present but not a valid key (HTTP 400)."""


def check_key(raw: bytes | str | None) -> str | None:
    """The key, or ``None`` when the header is absent; raises :class:`BadIdempotencyKey`.

    Visible ASCII only (0x21–0x7E): a key is echoed in logs and used in store
    keys, so spaces, control bytes and non-ASCII are refused rather than escaped.
    """
    if raw is None:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            raise BadIdempotencyKey(f"{HEADER} must be visible ASCII") from None
    key = raw.strip().strip('"')  # the draft writes it as a quoted string
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise BadIdempotencyKey(f"{HEADER} must be 1 to {MAX_KEY_LENGTH} characters")
    if any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise BadIdempotencyKey(f"{HEADER} must be visible ASCII (no spaces or controls)")
    return key


def fingerprint(body: bytes) -> str:
    """The body's identity for "same key, same request": sha256 of the exact bytes."""
    return hashlib.sha256(body).hexdigest()


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON data: an upload (anything with ``data`` bytes) becomes
    ``{"$sha256", "content_type", "filename"}``; mappings and sequences recurse."""
    data = getattr(value, "data", None)
    if isinstance(data, bytes | bytearray | memoryview):
        return {
            "$sha256": hashlib.sha256(data).hexdigest(),
            "content_type": getattr(value, "content_type", None),
            "filename": getattr(value, "filename", None),
        }
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$sha256": hashlib.sha256(value).hexdigest()}
    return value


def submission_fingerprint(
    images: Sequence[bytes], params: Mapping[str, Any], extras: Mapping[str, Any]
) -> str:
    """The parsed request's identity for "same key, same request" (module docstring):
    sha256 of a canonical JSON (sorted keys) of its images' digests, its ``params``
    (uploads by digest, type and file name) and ``extras`` (job fields, the answer's
    form). Pure; the bytes are hashed once each, never copied."""
    doc = {
        "images": [hashlib.sha256(image).hexdigest() for image in images],
        "params": _canonical(params),
        "extras": _canonical(extras),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
