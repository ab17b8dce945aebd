"""The request payload of a job on the wire of a shared store (pure).

A validated :class:`~mortred_twisted.model_api.base.InferenceRequest` as bytes::

    b"MJ1" | 4-byte big-endian length of the head | head (compact JSON:
    {"r": req_id, "p": params, "n": [length of each image], "f": 1 only when the
    job's result files come back inline}) | the images, raw, one after another

Images travel as they are (no base64: a 1 MB image stays 1 MB in Redis and costs no
encoding pass). Params are what the model's ``validate`` returned from JSON input,
so they round-trip (tuples come back as lists). No pickle: whoever can write to
Redis must not be able to run code in a replica. A payload that does not add up
(truncated, lengths that overrun, trailing bytes) raises :class:`ValueError`; the
earlier all-JSON form (``{"r", "i": [base64], "p"}``, jobs queued by a replica of
the previous release) is still read.
"""

from __future__ import annotations

import base64
import json

from mortred_twisted.model_api.base import InferenceRequest

MAGIC = b"MJ1"
_HEAD_LEN = 4


def encode_request(request: InferenceRequest) -> bytes:
    """The payload bytes of ``request`` for the job hash."""
    doc = {"r": request.req_id, "p": dict(request.params), "n": [len(i) for i in request.images]}
    if request.inline_files:
        doc["f"] = 1
    head = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return b"".join((MAGIC, len(head).to_bytes(_HEAD_LEN, "big"), head, *request.images))


def decode_request(payload: bytes) -> InferenceRequest:
    """The request of :func:`encode_request`'s bytes (ValueError if malformed)."""
    if payload[:1] == b"{":
        return _decode_json(payload)
    if payload[: len(MAGIC)] != MAGIC:
        raise ValueError("job payload: unknown format")
    start = len(MAGIC) + _HEAD_LEN
    head_len = int.from_bytes(payload[len(MAGIC) : start], "big")
    if len(payload) < start + head_len:
        raise ValueError("job payload: truncated head")
    head = json.loads(payload[start : start + head_len])
    if not isinstance(head, dict) or not {"r", "p", "n"} <= head.keys():
        raise ValueError("job payload: bad head")
    lengths = head["n"]
    if not isinstance(lengths, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths
    ):
        raise ValueError("job payload: bad image lengths")
    images = []
    at = start + head_len
    for n in lengths:
        if at + n > len(payload):
            raise ValueError("job payload: truncated image")
        images.append(payload[at : at + n])
        at += n
    if at != len(payload):
        raise ValueError("job payload: trailing bytes")
    return InferenceRequest(
        req_id=head["r"], images=tuple(images), params=head["p"], inline_files=bool(head.get("f"))
    )


def _decode_json(payload: bytes) -> InferenceRequest:
    doc = json.loads(payload)
    return InferenceRequest(
        req_id=doc["r"],
        images=tuple(base64.b64decode(image) for image in doc["i"]),
        params=doc["p"],
    )
