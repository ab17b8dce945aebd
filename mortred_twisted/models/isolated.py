"""Process-isolated model workers (``worker_isolation = "process"``).

A model thread that runs Python glue between torch ops (a sampler loop) holds the
GIL for long stretches, and the reactor thread waits for it. With process isolation
each worker's model lives in its own child process (``multiprocessing`` *spawn*
context, so no forked reactor state): the server's model thread only blocks on a
pipe (GIL released) while the child does the work with its own interpreter.

:class:`IsolatedModel` is a :class:`~mortred_twisted.model_api.base.Model` proxy, so the
worker pool, runner and sync path are unchanged. Protocol over one duplex pipe
(pickled tuples):

* parent → child: ``("run", request, files_url_prefix | None)``, ``("run_batch",
  requests)``, ``("cancel",)``, ``("stop",)``;
* child → parent: ``("ready", validator)`` / ``("load_error", message)`` once;
  ``("progress", step, total)`` and ``("event", name, data)`` during a run;
  ``("result", data_json, run_ms, [(name, bytes, content_type), …])`` (the run's
  result files, stored by the parent before the job can end) or ``("error", kind,
  message)``; for a batch ``("batch", [(ok, payload), …])``.

An SDK model's validation twin is its declaration, sent as JSON
(:meth:`~mortred_twisted.sdk.adapter.SdkModel.__reduce__`): the server process never
imports the user's module.

**Validation without a model in the server.** The server's reactor validates
requests before admission (:meth:`Model.validate`, cheap by contract). The model is
loaded only in the workers: each child sends back its *validation twin*, an
instance of the model's class holding only ``params_schema``, ``uses_images``,
``output_schema`` and ``input_limits`` (no weights), built without ``__init__``; the
parent validates
with it. A model whose ``validate`` needs more than those (and module-level
state) must say so by overriding :meth:`Model.validation_twin` — none does today.

The child encodes results as JSON itself, so only bytes cross the pipe. A child that
dies mid-run fails that run with :class:`WorkerCrashed`; the next run starts a new
child. Thread contract: ``run``/``run_batch`` are called from one model thread at a
time per instance (the worker pool guarantees it).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InputDecodeError,
    InvalidRequest,
    Model,
    ModelLoadError,
    RunCancelled,
    RunContext,
)
from mortred_twisted.sdk.media import UnreadableImage

POLL_S = 0.05
START_TIMEOUT_S = 300.0


class WorkerCrashed(RuntimeError):
    """The worker process died during a run."""


class PreEncoded(bytes):
    """A model result that is already JSON bytes (the runtime does not re-encode it)."""


class RemoteModelError(RuntimeError):
    """An exception raised by the model inside the worker process."""


def _encode_error(exc: BaseException) -> tuple[str, str]:
    """A worker's exception as (kind, text) for the pipe; ``_decode_error`` makes the
    same class again on the server. An error that is both an InvalidRequest and an
    InputDecodeError (the SDK's ``UnreadableImage``) keeps both, so the server answers
    it as the in-process model does (400, code 3, the input named)."""
    if isinstance(exc, InvalidRequest) and isinstance(exc, InputDecodeError):
        return "unreadable", f"{exc.field}\x00{exc.message}"
    if isinstance(exc, InvalidRequest):
        return "invalid", f"{exc.field}\x00{exc.message}"
    if isinstance(exc, InputDecodeError):
        return "decode", str(exc)
    if isinstance(exc, RunCancelled):
        return "cancelled", str(exc)
    return "error", f"{type(exc).__name__}: {exc}"


def _decode_error(kind: str, message: str) -> BaseException:
    if kind == "unreadable":
        field, _, text = message.partition("\x00")
        return UnreadableImage(field, text)
    if kind == "invalid":
        field, _, text = message.partition("\x00")
        return InvalidRequest(field, text)
    if kind == "decode":
        return InputDecodeError(message)
    if kind == "cancelled":
        return RunCancelled(message)
    return RemoteModelError(message)


class _CollectedFiles:
    """The result-file sink of a run inside the worker: files are kept and sent to the
    server with the result, which stores them in its own sink (same URLs)."""

    def __init__(self, url_prefix: str) -> None:
        self.url_prefix = url_prefix
        self.files: list[tuple[str, bytes, str]] = []

    def put(self, name: str, data: bytes, content_type: str) -> None:
        self.files.append((name, data, content_type))


class _ChildContext(RunContext):
    """Run context inside the worker: progress and model events go up the pipe,
    cancel comes down."""

    def __init__(self, conn: Connection, files_prefix: str | None = None) -> None:
        super().__init__()
        self._conn = conn
        if files_prefix is not None:
            self.result_files = _CollectedFiles(files_prefix)
        self.on_event = lambda name, data: conn.send(("event", name, data))

    def progress(self, step: int, total: int) -> None:
        super().progress(step, total)
        self._conn.send(("progress", step, total))

    def check_cancelled(self) -> None:
        while not self.cancelled and self._conn.poll(0):
            if self._conn.recv()[0] == "cancel":
                self.cancel()
        super().check_cancelled()


#: the only attributes a validation twin carries (see the module docstring)
TWIN_ATTRIBUTES = ("params_schema", "uses_images", "output_schema", "input_limits")


def validation_twin(model: Model) -> Model:
    """A weightless instance of ``model``'s class that validates like it (picklable:
    the class by reference, the attributes by value)."""
    custom = getattr(model, "validation_twin", None)
    if custom is not None:
        return custom()
    cls = type(model)
    twin = cls.__new__(cls)
    for name in TWIN_ATTRIBUTES:
        if name in vars(model):
            setattr(twin, name, getattr(model, name))
    return twin


def _child_main(
    model_type: str,
    options: dict[str, Any],
    root: str,
    niceness: int,
    torch_threads: int,
    conn: Connection,
) -> None:
    """Entry point of a worker process: load, then serve runs until told to stop."""
    from mortred_twisted.models.registry import create_model
    from mortred_twisted.models.threads import apply_torch_threads

    if niceness > 0 and hasattr(os, "nice"):
        os.nice(niceness)  # the server's reactor wins the CPU when both want it

    try:
        model = create_model(model_type, options, Path(root))
    except BaseException as exc:
        conn.send(("load_error", f"{type(exc).__name__}: {exc}"))
        return
    apply_torch_threads(torch_threads)
    conn.send(("ready", validation_twin(model)))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        op = message[0]
        if op == "stop":
            model.close()
            return
        if op == "cancel":
            continue  # arrived after its run ended
        ctx = _ChildContext(conn, message[2] if op == "run" and len(message) > 2 else None)
        if op == "run":
            started = time.perf_counter()
            try:
                data = model.run(message[1], ctx)
                encoded = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
                files = ctx.result_files.files if ctx.result_files is not None else []
                run_ms = (time.perf_counter() - started) * 1000.0
                conn.send(("result", encoded, run_ms, files))
            except BaseException as exc:
                conn.send(("error", *_encode_error(exc)))
        elif op == "run_batch":
            requests = message[1]
            outputs = model.run_batch(requests, [ctx] * len(requests))
            packed = []
            for out in outputs:
                if isinstance(out, BaseException):
                    packed.append((False, _encode_error(out)))
                else:
                    packed.append((True, json.dumps(out, separators=(",", ":")).encode()))
            conn.send(("batch", packed))


class IsolatedModel(Model):
    """A model instance living in a worker process (see the module docstring)."""

    def __init__(
        self,
        model_type: str,
        options: Mapping[str, Any],
        root: Path,
        local: Model | None = None,
        *,
        niceness: int = 0,
        torch_threads: int = 1,
        cancel_grace_s: float | None = None,
    ) -> None:
        self._args = (model_type, dict(options), str(root), niceness, torch_threads)
        self._cancel_grace_s = cancel_grace_s
        #: how many runs were ended by killing the worker process (for tests/metrics)
        self.killed_runs = 0
        #: validates requests in the server; a given ``local`` model, else the twin
        #: the worker sent (see the module docstring)
        self._local: Model | None = local
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._start()
        assert self._local is not None
        self.params_schema = self._local.params_schema
        self.uses_images = self._local.uses_images
        self.output_schema = self._local.output_schema
        #: an SDK model's declaration (its twin's), for the OpenAPI document and forms
        self.declaration = getattr(self._local, "declaration", None)
        self.images_optional = getattr(self._local, "images_optional", False)

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=_child_main, args=(*self._args, child), daemon=True, name="mortred-worker"
        )
        process.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            process.kill()
            raise ModelLoadError("worker process did not start in time")
        try:
            hello = parent.recv()
        except EOFError:
            raise ModelLoadError("worker process exited while loading") from None
        if hello[0] != "ready":
            process.join(5)
            raise ModelLoadError(f"worker process: {hello[1]}")
        if self._local is None:
            self._local = hello[1]
        self._conn, self._process = parent, process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        assert self._local is not None
        return self._local.validate(request)

    def validation_twin(self) -> Model | None:
        """The weightless twin the worker sent: what validates a request here."""
        return self._local

    def _ensure_alive(self) -> Connection:
        if self._process is None or not self._process.is_alive() or self._conn is None:
            self._start()
        assert self._conn is not None
        return self._conn

    def _exchange(self, message: tuple, ctx: RunContext | None) -> tuple:
        conn = self._ensure_alive()
        conn.send(message)
        cancel_sent_at: float | None = None
        while True:
            try:
                ready = conn.poll(POLL_S)
                if ctx is not None and ctx.cancelled and cancel_sent_at is None:
                    conn.send(("cancel",))
                    cancel_sent_at = time.monotonic()
                if (
                    not ready
                    and cancel_sent_at is not None
                    and self._cancel_grace_s is not None
                    and time.monotonic() - cancel_sent_at > self._cancel_grace_s
                ):
                    self._kill_and_respawn()
                    raise RunCancelled(
                        "run did not stop within cancel_grace_ms: its worker process was killed"
                    )
                if not ready:
                    if self._process is not None and not self._process.is_alive():
                        raise EOFError
                    continue
                reply = conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self._process = None
                raise WorkerCrashed("model worker process died during the run") from None
            if reply[0] == "progress":
                if ctx is not None:
                    ctx.progress(reply[1], reply[2])
                continue
            if reply[0] == "event":
                if ctx is not None:
                    ctx.event(reply[1], reply[2])
                continue
            return reply

    def _kill_and_respawn(self) -> None:
        """End a run that ignores its cancel flag: the compute goes back at once; a
        fresh worker process is started for the next run (lazily if that fails)."""
        self.killed_runs += 1
        if self._process is not None:
            self._process.kill()
            self._process.join(10)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._process, self._conn = None, None
        # A failed respawn is retried by the next run (_ensure_alive), which then
        # fails with the loader's error.
        with contextlib.suppress(ModelLoadError):
            self._start()

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        sink = ctx.result_files
        prefix = sink.url_prefix if sink is not None else None
        reply = self._exchange(("run", request, prefix), ctx)
        if reply[0] == "error":
            raise _decode_error(reply[1], reply[2])
        for name, data, content_type in reply[3] if len(reply) > 3 else ():
            sink.put(name, data, content_type)  # before the job can end done
        return PreEncoded(reply[1])

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        reply = self._exchange(("run_batch", list(requests)), ctxs[0] if ctxs else None)
        return [PreEncoded(payload) if ok else _decode_error(*payload) for ok, payload in reply[1]]

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("stop",))
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
