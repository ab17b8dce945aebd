"""The request payload of a job on the wire of a shared store (pure).

A validated :class:`~mortred_twisted.models.base.InferenceRequest` as compact JSON:
``{"r": req_id, "i": [base64 images], "p": params}``. Params are what the model's
``validate`` returned from JSON input, so they round-trip (tuples come back as
lists). No pickle: whoever can write to Redis must not be able to run code in a
replica.
"""

from __future__ import annotations

import base64
import json

from mortred_twisted.models.base import InferenceRequest


def encode_request(request: InferenceRequest) -> bytes:
    """JSON bytes of ``request`` for the job hash."""
    doc = {
        "r": request.req_id,
        "i": [base64.b64encode(image).decode("ascii") for image in request.images],
        "p": dict(request.params),
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def decode_request(payload: bytes) -> InferenceRequest:
    """The request of :func:`encode_request`'s bytes."""
    doc = json.loads(payload)
    return InferenceRequest(
        req_id=doc["r"],
        images=tuple(base64.b64decode(image) for image in doc["i"]),
        params=doc["p"],
    )
