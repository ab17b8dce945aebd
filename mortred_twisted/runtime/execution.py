"""Running a model call on the model thread pool and encoding its result there.

The result ``data`` is JSON-encoded on the worker thread, so the reactor never
spends GIL time serialising large payloads (base64 PNGs): the HTTP layer splices
the pre-encoded bytes into the envelope.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.models.isolated import PreEncoded


class ThreadRunner(Protocol):
    """What the runtime needs of a thread pool (see :class:`ModelThreadPool`)."""

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]: ...


@dataclass(frozen=True)
class EncodedResult:
    """A model's ``data`` as JSON bytes, and how long the model ran (ms)."""

    data_json: bytes
    run_ms: float


def encode_data(data: Any) -> bytes:
    """JSON bytes of ``data``; results already encoded by a worker process pass through."""
    if isinstance(data, PreEncoded):
        return bytes(data)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def run_and_encode(model: Model, request: InferenceRequest, ctx: RunContext) -> EncodedResult:
    """Worker-thread body: run the model, encode ``data``; exceptions propagate."""
    started = time.perf_counter()
    data = model.run(request, ctx)
    run_ms = (time.perf_counter() - started) * 1000.0
    return EncodedResult(encode_data(data), run_ms)


def run_batch_and_encode(
    model: Model, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
) -> list[EncodedResult | BaseException]:
    """Worker-thread body for a batch: per-item results or exceptions, encoded."""
    started = time.perf_counter()
    outputs = model.run_batch(requests, ctxs)
    run_ms = (time.perf_counter() - started) * 1000.0
    encoded: list[EncodedResult | BaseException] = []
    for out in outputs:
        if isinstance(out, BaseException):
            encoded.append(out)
            continue
        try:
            encoded.append(EncodedResult(encode_data(out), run_ms))
        except (TypeError, ValueError) as exc:
            encoded.append(exc)
    return encoded
