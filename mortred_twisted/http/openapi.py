"""The OpenAPI 3 document of one model server, built from its config and model.

Kept in sync with the Klein routes by ``tests/http/test_openapi.py``, which compares
the paths and methods here with the app's registered routes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mortred_twisted import __version__
from mortred_twisted.config.server import ServerConfig
from mortred_twisted.model_api.params import ParamSpec

_ERROR = {"$ref": "#/components/schemas/JobError"}
_ENVELOPE_ERROR = {"$ref": "#/components/schemas/ErrorEnvelope"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def build_openapi(
    config: ServerConfig,
    params: Sequence[ParamSpec],
    output_schema: Mapping[str, Any] | None = None,
    declaration: Any = None,
) -> dict[str, Any]:
    """The document for ``config`` whose model accepts ``params`` and answers
    ``data`` of ``output_schema``; an SDK model's ``declaration``
    (:class:`~mortred_twisted.sdk.declaration.Declaration`) describes its inputs."""
    result_schema: dict[str, Any] = {"$ref": "#/components/schemas/Envelope"}
    if output_schema is not None:
        result_schema = {
            "allOf": [
                result_schema,
                {
                    "type": "object",
                    "properties": {"data": {"$ref": "#/components/schemas/ModelOutput"}},
                },
            ]
        }
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    security = [{"bearer": []}] if config.auth_token else []
    envelope_responses = {
        "200": _json(result_schema, "Inference result"),
        "400": _json(_ENVELOPE_ERROR, "Body is not JSON (code 50) or an image is undecodable (3)"),
        "401": _json(_ENVELOPE_ERROR, "Missing or wrong bearer token"),
        "405": _json(_ENVELOPE_ERROR, "Method not allowed (code 62)"),
        "413": _json(_ENVELOPE_ERROR, "Body over request_size_limit (code 61)"),
        "415": _json(_ENVELOPE_ERROR, "Content type is not application/json (code 60)"),
        "422": _json(_ENVELOPE_ERROR, "Invalid envelope or params (code 52)"),
        "429": _json(_ENVELOPE_ERROR, "Backpressure or rate limit; see Retry-After"),
        "503": _json(_ENVELOPE_ERROR, "Model not ready (code 65)"),
        "504": _json(_ENVELOPE_ERROR, "model_run_timeout expired (code 4)"),
    }
    status_ok = _json({"$ref": "#/components/schemas/JobStatus"}, "Current job status")
    paths: dict[str, Any] = {
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "OK"}}}},
        "/ready": {
            "get": {
                "summary": "Readiness: loaded and able to accept work",
                "responses": {"200": {"description": "Ready"}, "503": {"description": "Not ready"}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text/plain exposition"}},
            }
        },
        "/openapi.json": {
            "get": {"summary": "This document", "responses": {"200": {"description": "OK"}}}
        },
        config.server_uri: {
            "post": {
                "summary": "Synchronous inference",
                "security": security,
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Request"}}
                    },
                },
                "responses": envelope_responses,
            }
        },
        "/jobs": {
            "get": {
                "summary": "List your jobs, newest first (cursor paging)",
                "security": security,
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "required": False,
                        "description": "comma list of states to keep, e.g. pending,running",
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "required": False,
                        "description": "next_cursor of the previous page",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    "200": _json({"$ref": "#/components/schemas/JobList"}, "A page of jobs"),
                    "400": _json(_ERROR, "invalid state, limit or cursor"),
                },
            },
            "post": {
                "summary": "Submit an async job (202 at admission)",
                "security": security,
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "description": "1-255 visible ASCII characters; the same key and body "
                        "replay the first job (Idempotent-Replayed: true), another body is 422",
                        "schema": {"type": "string", "maxLength": 255},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Request"}}
                    },
                },
                "responses": {
                    "202": _json({"$ref": "#/components/schemas/JobAccepted"}, "Admitted"),
                    "404": _json(_ERROR, "Async jobs disabled on this server"),
                    "422": _json(_ERROR, "Invalid envelope or params; nothing admitted"),
                    "429": _json(_ERROR, "async queue full; see Retry-After"),
                },
            },
        },
        "/jobs/{job_id}": {
            "get": {
                "summary": "Poll a job",
                "security": security,
                "parameters": [job_id],
                "responses": {"200": status_ok, "404": _json(_ERROR, "job not found")},
            },
            "delete": {
                "summary": "Cancel a job (pending: at once; running: asked to stop)",
                "security": security,
                "parameters": [job_id],
                "responses": {
                    "200": _json({"$ref": "#/components/schemas/JobStatus"}, "Cancelled"),
                    "202": _json(
                        {"$ref": "#/components/schemas/JobStatus"},
                        "Running: cancel requested (cancel_requested: true)",
                    ),
                    "404": _json(_ERROR, "job not found"),
                    "409": _json(_ERROR, "job already finished (state: …)"),
                },
            },
        },
        "/queue": {
            "get": {
                "summary": "The model's queue: depth, running, oldest wait; one line per "
                "caller for a caller that sees every job, else the caller's own line",
                "security": security,
                "responses": {"200": _json({"type": "object"}, "the queue")},
            }
        },
        "/jobs/{job_id}/events": {
            "get": {
                "summary": "Live events (text/event-stream): state, progress, then a terminal "
                "event named after the state",
                "security": security,
                "parameters": [job_id],
                "responses": {
                    "200": {
                        "description": "server-sent events; data is the JobStatus JSON",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    "404": _json(_ERROR, "job not found"),
                },
            }
        },
        "/jobs/{job_id}/wait": {
            "get": {
                "summary": "Long-poll until terminal or the budget expires",
                "security": security,
                "parameters": [
                    job_id,
                    {
                        "name": "timeout",
                        "in": "query",
                        "required": False,
                        "description": "milliseconds; default 30000, capped at 300000",
                        "schema": {"type": "integer", "minimum": 0, "default": 30000},
                    },
                ],
                "responses": {
                    "200": status_ok,
                    "400": _json(_ERROR, "invalid timeout"),
                    "404": _json(_ERROR, "job not found"),
                },
            }
        },
        "/jobs/{job_id}/result": {
            "get": {
                "summary": "Fetch the result of a done job (repeatable)",
                "security": security,
                "parameters": [job_id],
                "responses": {
                    "200": _json(result_schema, "Result envelope"),
                    "404": _json(_ERROR, "job not found"),
                    "409": _json(_ERROR, "job not finished (state: …)"),
                },
            }
        },
        "/jobs/{job_id}/files/{name}": {
            "get": {
                "summary": "One result file of a done job (its result's data names it by "
                "url); ETag, If-None-Match, single byte ranges",
                "security": security,
                "parameters": [
                    job_id,
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "Range",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    "200": {"description": "the file's bytes (its own Content-Type)"},
                    "206": {"description": "one range of them (Content-Range)"},
                    "304": {"description": "not modified (If-None-Match)"},
                    "404": _json(_ERROR, "job or file not found"),
                    "409": _json(_ERROR, "job not finished (state: …)"),
                    "416": _json(_ERROR, "range not satisfiable"),
                },
            }
        },
    }
    openai_error = {"type": "object", "properties": {"error": {"type": "object"}}}
    paths["/v1/images/generations"] = {
        "post": {
            "summary": "OpenAI images API (docs/protocols.md): prompt, n, size WxH, "
            "response_format b64_json|url, the model's own inputs; Prefer: respond-async "
            "gives the 202 job",
            "security": security,
            "responses": {
                "200": _json({"type": "object"}, '{"created", "data": [...]}'),
                "202": _json({"type": "object"}, "job admitted (Prefer: respond-async)"),
                "400": _json(openai_error, "invalid_request_error naming the param"),
            },
        }
    }
    paths["/v1/images/edits"] = {
        "post": {
            "summary": "OpenAI images edits (multipart: image, mask?, prompt, n, size, "
            "response_format) for image-to-image and inpainting models",
            "security": security,
            "responses": {
                "200": _json({"type": "object"}, '{"created", "data": [...]}'),
                "400": _json(openai_error, "invalid_request_error naming the param"),
            },
        }
    }
    paths["/v1/models"] = {
        "get": {
            "summary": "OpenAI models list: this port's model",
            "security": security,
            "responses": {"200": _json({"type": "object"}, "the list")},
        }
    }
    oip = {"type": "object"}
    for path, method, summary in (
        ("/v2/health/live", "get", "Open Inference Protocol v2: live"),
        ("/v2/health/ready", "get", "OIP v2: ready (503 until the model is loaded)"),
        ("/v2", "get", "OIP v2: server metadata"),
        ("/v2/models/{model}", "get", "OIP v2: the model's inputs and outputs as tensors"),
        ("/v2/models/{model}/ready", "get", "OIP v2: model ready"),
        ("/v2/models/{model}/infer", "post", "OIP v2: infer (JSON or binary tensors), "
         "answered when the job ends (docs/protocols.md)"),
    ):  # fmt: skip
        operation: dict[str, Any] = {
            "summary": summary,
            "responses": {"200": _json(oip, "OIP answer"), "400": _json(oip, '{"error"}')},
        }
        if "{model}" in path:
            operation["security"] = security
            operation["parameters"] = [
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
            ]
        paths[path] = {method: operation}
    replicate = {"type": "object"}
    for path, method, summary, names in (
        ("/v1/predictions", "post", "Replicate: create a prediction (Prefer: wait[=n])", ()),
        ("/v1/predictions/{prediction_id}", "get", "Replicate: a prediction",
         ("prediction_id",)),
        ("/v1/predictions/{prediction_id}/cancel", "post", "Replicate: cancel",
         ("prediction_id",)),
        ("/v1/models/{owner}/{model_name}", "get", "Replicate: the model (mortred/<id>)",
         ("owner", "model_name")),
        ("/v1/models/{owner}/{model_name}/predictions", "post", "Replicate: create for the model",
         ("owner", "model_name")),
        ("/v1/models/{owner}/{model_name}/versions/{version}", "get", "Replicate: its one version",
         ("owner", "model_name", "version")),
    ):  # fmt: skip
        paths[path] = {
            method: {
                "summary": summary,
                "security": security,
                "parameters": [
                    {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                    for n in names
                ],
                "responses": {"200": _json(replicate, "a prediction or model (docs/protocols.md)")},
            }
        }
    param_props = {p.name: p.json_schema() for p in params}
    document: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": f"mortred model server: {config.id}",
            "version": __version__,
            "description": f"Model type {config.model_type}; async jobs "
            + ("enabled" if config.async_enabled else "disabled (the /jobs routes answer 404)"),
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Request": {
                    "type": "object",
                    "properties": {
                        "req_id": {"type": "string"},
                        "images": {
                            "type": "array",
                            "items": {"type": "string", "format": "byte"},
                            "minItems": 1,
                        },
                        "img_data": {"type": "string", "format": "byte"},
                        "params": {
                            "type": "object",
                            "properties": param_props,
                            "additionalProperties": False,
                        },
                        "webhook": {
                            "type": "string",
                            "format": "uri",
                            "description": "jobs only: http(s) URL on a host in the server's "
                            "webhook_allowed_hosts; receives signed job events",
                        },
                        "webhook_events_filter": {
                            "type": "array",
                            "items": {"type": "string", "enum": ["start", "progress", "completed"]},
                            "description": "jobs only: events to deliver (default all)",
                        },
                        "priority": {
                            "type": "string",
                            "enum": ["low", "normal", "high"],
                            "default": "normal",
                            "description": "jobs only: band; at most the key's max_priority",
                        },
                    },
                    "additionalProperties": False,
                },
                "JobList": {
                    "type": "object",
                    "required": ["jobs", "next_cursor"],
                    "properties": {
                        "jobs": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/JobStatus"},
                        },
                        "next_cursor": {"type": "string", "nullable": True},
                    },
                },
                "Envelope": {
                    "type": "object",
                    "required": ["req_id", "code", "msg", "data"],
                    "properties": {
                        "req_id": {"type": "string"},
                        "code": {"type": "integer"},
                        "msg": {"type": "string"},
                        "data": {},
                    },
                },
                "ErrorEnvelope": {
                    "type": "object",
                    "properties": {
                        "req_id": {"type": "string"},
                        "code": {"type": "integer"},
                        "msg": {"type": "string"},
                        "data": {"nullable": True},
                    },
                },
                "JobError": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "string"}, "code": {"type": "integer"}},
                },
                "JobAccepted": {
                    "type": "object",
                    "required": ["job_id", "state", "poll_url", "result_url"],
                    "properties": {
                        "job_id": {"type": "string", "pattern": "^job_"},
                        "state": {"type": "string", "enum": ["pending"]},
                        "poll_url": {"type": "string"},
                        "result_url": {"type": "string"},
                    },
                },
                "JobStatus": {
                    "type": "object",
                    "required": ["job_id", "state", "elapsed_ms"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "state": {
                            "type": "string",
                            "enum": [
                                "pending",
                                "running",
                                "done",
                                "failed",
                                "timeout",
                                "cancelled",
                            ],
                        },
                        "elapsed_ms": {"type": "integer"},
                        "queue_position": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "pending only: 1 = next to get a worker",
                        },
                        "cancel_requested": {
                            "type": "boolean",
                            "description": "running and asked to stop",
                        },
                        "queued_ms": {"type": "integer"},
                        "completed_at": {
                            "type": "number",
                            "description": "unix time of the terminal transition",
                        },
                        "error": {"type": "string"},
                        "req_id": {"type": "string"},
                        "progress": {
                            "type": "object",
                            "properties": {
                                "step": {"type": "integer"},
                                "total": {"type": "integer"},
                            },
                        },
                        "poll_url": {"type": "string"},
                        "result_url": {"type": "string"},
                    },
                },
            },
        },
    }
    if output_schema is not None:
        document["components"]["schemas"]["ModelOutput"] = dict(output_schema)
    if declaration is not None:
        _declare_inputs(document, declaration)
    return document


RESULT_FILE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "content_type", "size", "sha256"],
    "properties": {
        "url": {"type": "string", "description": "GET it (same credentials); stored files"},
        "name": {"type": "string"},
        "content_type": {"type": "string"},
        "size": {"type": "integer"},
        "sha256": {"type": "string"},
        "base64": {"type": "string", "format": "byte", "description": "inline results only"},
    },
}


def _declare_inputs(document: dict[str, Any], declaration: Any) -> None:
    """An SDK model: params from its declaration (required inputs, bounds, choices,
    files), images optional, multipart submits, and the result-file schema."""
    schemas = document["components"]["schemas"]
    inputs = declaration.inputs_schema()
    request = schemas["Request"]
    request["properties"]["params"] = inputs
    request["properties"]["images"].pop("minItems", None)
    request["properties"]["images"]["description"] = (
        "fills the model's single Image (or list[Image]) input"
    )
    schemas["ResultFile"] = RESULT_FILE
    form: dict[str, Any] = {
        "type": "object",
        "properties": {
            **{name: _form_field(prop) for name, prop in inputs["properties"].items()},
            "params": {"type": "string", "description": "a JSON object of further inputs"},
        },
        "required": inputs["required"],
    }
    schemas["FormRequest"] = form
    multipart = {"schema": {"$ref": "#/components/schemas/FormRequest"}}
    for methods in document["paths"].values():
        post = methods.get("post")
        body = post.get("requestBody") if post else None
        if body and "Request" in str(body["content"]["application/json"]["schema"]):
            body["content"]["multipart/form-data"] = multipart
    info = document["info"]
    info["x-mortred-model"] = declaration.to_json()
    if declaration.description:
        info["description"] = declaration.description + "\n\n" + info["description"]


def _form_field(prop: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-schema input as a form field (files are binary parts)."""
    if prop.get("type") == "array":
        return {"type": "array", "items": _form_field(prop["items"]), "maxItems": prop["maxItems"]}
    if "x-mortred-kind" in prop:
        return {"type": "string", "format": "binary"}
    return dict(prop)
