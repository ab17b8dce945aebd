"""A job's status answer (pure): the JSON every poll, wait, event and webhook carries.

Assembled directly rather than through ``json.dumps`` of a dict: every poll builds
one. Job ids are ``job_`` + hex and states are fixed words, so only the free text
(``error``, ``req_id``) goes through the JSON encoder.
"""

from __future__ import annotations

import json
import math
from typing import Any

from mortred_twisted.jobs.types import JobSnapshot


def status_body(snap: JobSnapshot) -> bytes:
    """The status JSON of ``snap`` (see docs/api.md for every field)."""
    job_id = snap.job_id
    parts = [f'{{"job_id":"{job_id}","state":"{snap.state.value}","elapsed_ms":{snap.elapsed_ms}']
    if snap.error is not None:
        parts.append(f',"error":{json.dumps(snap.error)}')
    if snap.progress is not None:
        parts.append(f',"progress":{{"step":{snap.progress[0]},"total":{snap.progress[1]}}}')
    if snap.queue_position is not None:
        parts.append(f',"queue_position":{snap.queue_position}')
    if snap.cancel_requested:
        parts.append(',"cancel_requested":true')
    if snap.queued_ms is not None:
        parts.append(f',"queued_ms":{snap.queued_ms}')
    if snap.completed_unix is not None:
        parts.append(f',"completed_at":{snap.completed_unix:.6f}')
    parts.append(
        f',"req_id":{json.dumps(snap.task_id)},"poll_url":"/jobs/{job_id}",'
        f'"result_url":"/jobs/{job_id}/result"}}'
    )
    return "".join(parts).encode("utf-8")


def status_doc(snap: JobSnapshot) -> dict[str, Any]:
    """The same answer as a dict (webhook bodies add ``result`` to it)."""
    doc: dict[str, Any] = json.loads(status_body(snap))
    return doc


def retry_after_s(mean_run_s: float | None, busy_workers: int, waiting_ahead: int = 0) -> int:
    """Whole seconds until a refused client is likely to be admitted (≥ 1).

    A slot frees when a running job ends; with ``busy_workers`` runs in parallel
    that is ``mean_run_s / busy_workers`` on average, and ``waiting_ahead`` jobs
    that must start first each add their share. Without a measured run time yet,
    1 second.
    """
    if mean_run_s is None or mean_run_s <= 0:
        return 1
    workers = max(1, busy_workers)
    return max(1, math.ceil(mean_run_s * (1 + max(0, waiting_ahead)) / workers))
