"""A model's OpenAPI document as the gateway serves it (pure).

``GET /v1/models/<id>/openapi.json`` forwards to the model process's own
``GET /openapi.json`` and answers :func:`public_openapi` of it: the same document
(inputs, outputs, schemas, the declaration of an SDK model) with the paths a client
calls *at the gateway*, not the model port's:

==========================  =========================================
model port                  gateway
==========================  =========================================
``<server_uri>``            ``/v1/models/<id>/infer``
``/jobs``, ``/jobs/…``      ``/v1/models/<id>/jobs``, ``…/jobs/…``
``/queue``                  ``/v1/models/<id>/queue``
``/openapi.json``           ``/v1/models/<id>/openapi.json``
``/healthz`` ``/ready``     dropped (the model port's own; the gateway's
``/metrics``                ``/healthz`` and ``/metrics`` are the gateway's)
==========================  =========================================

Any other path the model documents is dropped too: the gateway routes nothing else
to a model. Security is the gateway's, not the model port's: every operation needs
the bearer (the gateway token or an API key) unless the gateway is open (no token,
no keys: loopback only), and each lists the gateway's own answers (401, and 429
for a key's rate limit). Nothing here does I/O; the gateway calls it on the reactor
thread.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

#: The gateway's own answers on every model route (access.py), added to each
#: operation when the gateway checks credentials.
_ERROR = {"$ref": "#/components/schemas/GatewayError"}
_GATEWAY_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_GATEWAY_ANSWERS = {
    "401": "missing or wrong credentials (WWW-Authenticate: Bearer)",
    "429": "the API key's rate limit; see Retry-After",
}
#: The model port's own paths the gateway does not route to a model.
_MODEL_PORT_ONLY = frozenset({"/healthz", "/ready", "/metrics"})


class NotADocument(ValueError):
    """The model's ``/openapi.json`` answer is not a JSON object with ``paths``."""


def public_path(path: str, model_id: str, server_uri: str) -> str | None:
    """Where the gateway serves the model port's ``path`` (an OpenAPI path template),
    or None when the gateway does not route it to the model."""
    base = f"/v1/models/{quote(model_id, safe='')}"
    if path == server_uri:
        return base + "/infer"
    if path == "/jobs" or path.startswith("/jobs/"):
        return base + path
    if path == "/queue" or path == "/openapi.json":
        return base + path
    if path in ("/v1/images/generations", "/v1/images/edits", "/v1/models"):  # OpenAI door
        return base + "/openai" + path
    if path.startswith(("/v1/predictions", "/v1/models/")):  # the Replicate door
        return base + "/replicate" + path
    if path == "/v2" or path.startswith("/v2/"):  # the OIP door (docs/protocols.md):
        return base + "/oip" + path.replace("{model}", quote(model_id, safe=""))  # one model
    return None


def _fixed_model(op: Any, path: str, public: str) -> Any:
    """``op`` less its ``model`` path parameter when the public path names the model."""
    if "{model}" not in path or "{model}" in public or not isinstance(op, dict):
        return op
    params = [
        p
        for p in op.get("parameters", ())
        if not (isinstance(p, dict) and p.get("name") == "model" and p.get("in") == "path")
    ]
    return {**op, "parameters": params}


def public_openapi(body: bytes, model_id: str, server_uri: str, secured: bool) -> bytes:
    """The model's ``/openapi.json`` body as the gateway serves it for ``model_id``
    (whose model port serves sync inference at ``server_uri``); ``secured``: the
    gateway checks credentials (False only for an open gateway). Raises
    :class:`NotADocument` for a body that is not a JSON object with a ``paths`` object."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise NotADocument(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict):
        raise NotADocument("not an OpenAPI document (no paths object)")
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        public = public_path(path, model_id, server_uri) if isinstance(path, str) else None
        if public is None or path in _MODEL_PORT_ONLY or not isinstance(item, dict):
            continue
        paths[public] = {m: _secure(_fixed_model(op, path, public), secured)
                         for m, op in item.items()}  # fmt: skip
    doc["paths"] = paths
    info = doc.get("info")
    if isinstance(info, dict):
        info["title"] = f"mortred gateway: {model_id}"
    doc.pop("servers", None)  # the model port's address is never a public one
    components = doc.setdefault("components", {})
    if isinstance(components, dict) and secured:
        schemas = components.setdefault("schemas", {})
        if isinstance(schemas, dict):
            schemas["GatewayError"] = _GATEWAY_ERROR
        schemes = components.setdefault("securitySchemes", {})
        if isinstance(schemes, dict):
            schemes["bearer"] = {
                "type": "http",
                "scheme": "bearer",
                "description": "the gateway token or an API key",
            }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _secure(operation: Any, secured: bool) -> Any:
    """One operation with the gateway's security (and its 401/403/429) in place of
    the model port's."""
    if not isinstance(operation, dict):
        return operation
    op = dict(operation)
    if not secured:  # the model's 401 never reaches a client (the gateway holds its token)
        op.pop("security", None)
        if isinstance(op.get("responses"), dict):
            op["responses"] = {k: v for k, v in op["responses"].items() if k != "401"}
        return op
    op["security"] = [{"bearer": []}]
    responses = op.get("responses")
    if isinstance(responses, dict):
        responses = dict(responses)
        for status, description in _GATEWAY_ANSWERS.items():
            answer = {
                "description": description,
                "content": {"application/json": {"schema": _ERROR}},
            }
            if status == "401":  # the gateway's, never the model port's (it holds the token)
                responses[status] = answer
            else:  # a model's own 403/429 (backpressure) keeps its description
                responses.setdefault(status, answer)
        op["responses"] = responses
    return op
