"""What the server answers, as plain values (pure; no IO).

:class:`JobStatus` is the status JSON of ``GET /jobs/{id}`` (and of wait, cancel,
each listed job and each event); :class:`Result` the result envelope; fields the
server leaves out are ``None`` and ``raw`` keeps the whole document.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

#: States a job never leaves.
TERMINAL_STATES = frozenset({"done", "failed", "timeout", "cancelled"})


@dataclass(frozen=True)
class Progress:
    """The model's last reported step (``step`` of ``total``)."""

    step: int
    total: int


@dataclass(frozen=True)
class JobStatus:
    """One job's status as the server reported it."""

    job_id: str
    state: str
    poll_url: str | None = None
    result_url: str | None = None
    progress: Progress | None = None
    queue_position: int | None = None
    elapsed_ms: int | None = None
    queued_ms: int | None = None
    error: str | None = None
    cancel_requested: bool = False
    completed_at: float | None = None
    req_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def terminal(self) -> bool:
        """True once the job has ended (done, failed, timeout, cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def done(self) -> bool:
        """True when the job ended with a result."""
        return self.state == "done"

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobStatus:
        """A status from its JSON; ``KeyError`` without ``job_id`` or ``state``."""
        p = doc.get("progress")
        progress = None
        if isinstance(p, dict) and "step" in p and "total" in p:
            progress = Progress(int(p["step"]), int(p["total"]))
        return cls(
            job_id=str(doc["job_id"]),
            state=str(doc["state"]),
            poll_url=doc.get("poll_url"),
            result_url=doc.get("result_url"),
            progress=progress,
            queue_position=doc.get("queue_position"),
            elapsed_ms=doc.get("elapsed_ms"),
            queued_ms=doc.get("queued_ms"),
            error=doc.get("error"),
            cancel_requested=bool(doc.get("cancel_requested", False)),
            completed_at=doc.get("completed_at"),
            req_id=doc.get("req_id"),
            raw=doc,
        )


@dataclass(frozen=True)
class Submitted:
    """The 202 of a submit: the job and whether the server replayed it
    (``Idempotent-Replayed: true``: the same key had admitted it before)."""

    status: JobStatus
    replayed: bool


@dataclass(frozen=True)
class Result:
    """A result envelope ``{"req_id", "code", "msg", "data"}`` (sync answer or
    ``/result``). ``data`` is the model's output as JSON."""

    req_id: str | None
    code: int
    msg: str
    data: Any
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Result:
        return cls(
            req_id=doc.get("req_id"),
            code=int(doc.get("code", 0)),
            msg=str(doc.get("msg", "")),
            data=doc.get("data"),
            raw=doc,
        )

    def files(self) -> list[ResultFile]:
        """The result files an SDK model's output names (``Image``/``File`` outputs,
        at any depth of ``data``), in the order they appear: each with its ``url``
        (stored with the job; fetch it with ``Client.download``) or its ``base64``
        (inline: ``Prefer: return=inline``, the sync path)."""
        found: list[ResultFile] = []
        _collect_files(self.data, found)
        return found

    def images(self) -> list[bytes]:
        """The output images (``data.images``, base64 PNGs) decoded to bytes; empty
        when the model outputs none."""
        items = self.data.get("images") if isinstance(self.data, dict) else None
        if not isinstance(items, list):
            return []
        return [_b64decode(item) for item in items if isinstance(item, str)]

    def pil_images(self) -> list[Any]:
        """The output images as PIL images (needs Pillow; ImportError otherwise)."""
        import io

        from PIL import Image

        return [Image.open(io.BytesIO(raw)) for raw in self.images()]

    def arrays(self) -> list[Any]:
        """The output images as numpy arrays (needs numpy and Pillow)."""
        import numpy as np

        return [np.asarray(img) for img in self.pil_images()]


@dataclass(frozen=True)
class ResultFile:
    """One result file as a result describes it (see :meth:`Result.files`)."""

    name: str
    content_type: str
    size: int
    sha256: str
    url: str | None = None
    base64: str | None = None

    def inline_bytes(self) -> bytes | None:
        """The bytes of an inline file (None for one stored with the job)."""
        return None if self.base64 is None else _b64decode(self.base64)


_FILE_KEYS = frozenset({"name", "content_type", "size", "sha256"})


def _collect_files(value: Any, out: list[ResultFile]) -> None:
    if isinstance(value, dict):
        if value.keys() >= _FILE_KEYS and ("url" in value or "base64" in value):
            out.append(
                ResultFile(
                    name=str(value["name"]),
                    content_type=str(value["content_type"]),
                    size=int(value["size"]),
                    sha256=str(value["sha256"]),
                    url=value.get("url"),
                    base64=value.get("base64"),
                )
            )
            return
        for item in value.values():
            _collect_files(item, out)
    elif isinstance(value, list):
        for item in value:
            _collect_files(item, out)


def _b64decode(text: str) -> bytes:
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    return base64.b64decode(text)


@dataclass(frozen=True)
class JobPage:
    """One page of a listing; ``next_cursor`` is ``None`` on the last page."""

    jobs: list[JobStatus]
    next_cursor: str | None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobPage:
        jobs = [JobStatus.from_json(j) for j in doc.get("jobs", []) if isinstance(j, dict)]
        return cls(jobs, doc.get("next_cursor"))


@dataclass(frozen=True)
class JobEvent:
    """One server-sent event of a job: ``name`` is ``state``, ``progress`` or the
    terminal state; ``id`` the stream's sequence; ``status`` the job's status.

    With ``events(model_events=True)``, a model declared with the server's SDK also
    sends its own events (``preview``, ``output``, …): ``model_event`` is then True,
    ``data`` holds what the model emitted (JSON; an image or file as its result-file
    description) and ``status`` is the last status seen before it."""

    name: str
    id: str | None
    status: JobStatus
    data: Any = None
    model_event: bool = False

    @property
    def terminal(self) -> bool:
        return not self.model_event and self.status.terminal
