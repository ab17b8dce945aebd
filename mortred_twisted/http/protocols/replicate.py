"""Replicate's predictions API as a front door (pure: no reactor, no HTTP objects).

A catalog id ``<ID>`` is the model ``mortred/<ID>`` with the one version ``<ID>``
(docs/protocols.md). A prediction is a job: its id is the job id, its ``status``
the job's state (``pending`` → ``starting``, ``running`` → ``processing``, ``done`` →
``succeeded``, ``failed``/``timeout`` → ``failed``, ``cancelled`` → ``canceled``), its
``output`` the result with every file as its URL.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

OWNER = "mortred"
STATUS = {
    "pending": "starting", "running": "processing", "done": "succeeded", "failed": "failed",
    "timeout": "failed", "cancelled": "canceled",
}  # fmt: skip
MAX_WAIT_S = 60
CREATE_FIELDS = ("input", "version", "webhook", "webhook_events_filter", "stream")


class ReplicateError(Exception):
    """An answer in Replicate's error shape ``{"title", "detail", "status"}``."""

    def __init__(self, status: int, detail: str, title: str = "Invalid request") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.title = title

    def body(self) -> dict[str, Any]:
        return {"title": self.title, "detail": self.detail, "status": self.status}


def check_model(owner: str, name: str, model_id: str) -> None:
    """404 unless ``owner/name`` is this port's model (``mortred/<id>``)."""
    if owner != OWNER or name != model_id:
        raise ReplicateError(
            404, f"model {owner[:100]}/{name[:100]} not found (this port serves "
            f"{OWNER}/{model_id})", "Not found",
        )  # fmt: skip


def parse_create(doc: Any, model_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(input, job fields)`` of a create body; raises :class:`ReplicateError` (422)."""
    if not isinstance(doc, dict):
        raise ReplicateError(422, "the body must be a JSON object")
    unknown = sorted(set(doc) - set(CREATE_FIELDS))
    if unknown:
        raise ReplicateError(422, f"{unknown[0][:100]}: unknown field")
    version = doc.get("version")
    if version is not None and version != model_id:
        raise ReplicateError(422, f"version: this port's model has the one version {model_id}")
    if doc.get("stream"):
        raise ReplicateError(422, "stream: not supported (use the job API's events)")
    inputs = doc.get("input", {})
    if not isinstance(inputs, dict):
        raise ReplicateError(422, "input: must be an object")
    fields = {k: doc[k] for k in ("webhook", "webhook_events_filter") if doc.get(k) is not None}
    return inputs, fields


def parse_wait(prefer: bytes | None) -> int | None:
    """Seconds a ``Prefer: wait[=n]`` asks to hold the create (capped), else None."""
    if prefer is None:
        return None
    for part in prefer.decode("latin-1").split(","):
        token = part.strip().lower()
        if token == "wait":
            return MAX_WAIT_S
        if token.startswith("wait="):
            value = token[5:].strip()
            if not value.isdigit() or len(value) > 6:
                raise ReplicateError(400, "Prefer: wait=<seconds> needs a whole number")
            return max(1, min(int(value), MAX_WAIT_S))
    return None


def _iso(unix: float | None) -> str | None:
    if unix is None:
        return None
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat().replace("+00:00", "Z")


def with_urls(data: Any, base: str) -> Any:
    """``data`` with each result-file description as its absolute URL."""
    if isinstance(data, Mapping):
        if isinstance(data.get("url"), str) and "sha256" in data:
            return base + data["url"]
        return {k: with_urls(v, base) for k, v in data.items()}
    if isinstance(data, list):
        return [with_urls(v, base) for v in data]
    return data


def prediction(
    model_id: str, snap: Any, output: Any, base: str, inputs: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The prediction object of the job ``snap`` (``output``: its result, or None)."""
    job = snap.job_id
    state = snap.state.value
    completed = snap.completed_unix
    metrics: dict[str, Any] = {}
    if snap.terminal and snap.queued_ms is not None:
        metrics["predict_time"] = max(0.0, (snap.elapsed_ms - snap.queued_ms) / 1000.0)
    created = (completed or now or 0.0) - snap.elapsed_ms / 1000.0 if (completed or now) else None
    started = None
    if created is not None and snap.queued_ms is not None:
        started = created + snap.queued_ms / 1000.0
    return {
        "id": job,
        "model": f"{OWNER}/{model_id}",
        "version": model_id,
        "status": STATUS.get(state, "processing"),
        "input": dict(inputs) if inputs is not None else None,
        "output": with_urls(output, base) if output is not None else None,
        "logs": "",
        "error": snap.error if state != "done" else None,
        "metrics": metrics,
        "created_at": _iso(created),
        "started_at": _iso(started),
        "completed_at": _iso(completed),
        "urls": {
            "get": f"{base}/v1/predictions/{job}",
            "cancel": f"{base}/v1/predictions/{job}/cancel",
        },
    }


def model_object(model_id: str, description: str, base: str, created: float) -> dict[str, Any]:
    return {
        "url": f"{base}/v1/models/{OWNER}/{model_id}", "owner": OWNER, "name": model_id,
        "description": description, "visibility": "public", "github_url": None,
        "paper_url": None, "license_url": None, "run_count": 0, "cover_image_url": None,
        "default_example": None, "latest_version": version_object(model_id, created),
    }  # fmt: skip


def version_object(model_id: str, created: float) -> dict[str, Any]:
    """The model's one version (``created``: when this server started)."""
    return {
        "id": model_id, "created_at": _iso(created), "cog_version": "none (mortred-twisted)",
        "openapi_schema": {"components": {"schemas": {"Output": {"type": "object"}}}},
    }  # fmt: skip


def public_prediction_urls(body: bytes, model_id: str, base: str) -> bytes:
    """A prediction (or model) answer relayed by the gateway with its URLs public:
    ``/v1/…`` ones under ``/v1/models/<id>/replicate``, result files (``/jobs/…``) at
    the gateway's file route. Any other body is returned unchanged."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body
    if not isinstance(doc, dict):
        return body
    prefix = f"{base}/v1/models/{quote(model_id, safe='')}"

    def public(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            path = urlsplit(value).path
            if path.startswith("/jobs/"):
                return prefix + path
            if path.startswith("/v1/"):
                return prefix + "/replicate" + path
            return value
        if isinstance(value, dict):
            return {k: public(v) for k, v in value.items()}
        if isinstance(value, list):
            return [public(v) for v in value]
        return value

    for name in ("output", "urls", "url"):
        if name in doc:
            doc[name] = public(doc[name])
    return json.dumps(doc, separators=(",", ":")).encode()
