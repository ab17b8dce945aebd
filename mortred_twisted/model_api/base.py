"""The model interface every served model implements.

Contract (shared by the sync ``/infer`` path and the async ``/jobs`` path):

* A model *family* module exposes ``create(options, root) -> Model`` (see
  :mod:`mortred_twisted.models.registry`). ``create`` is called once per worker
  (``worker_nums`` times) from a loader thread, never on the reactor thread; it may
  share immutable weights between its instances. Loading problems raise
  :class:`ModelLoadError` with a message an operator can act on (missing file,
  checksum mismatch, architecture mismatch): the server then stays *not ready*.
* :meth:`Model.validate` runs on the reactor thread, before admission: it must be
  cheap (no torch work) and raise :class:`InvalidRequest` naming the offending field.
  It returns the request with ``params`` normalised (defaults filled in).
* :meth:`Model.run` runs on a worker thread of the server's model thread pool, one call
  at a time per instance. It reports progress through ``ctx.progress(step, total)`` and
  calls ``ctx.check_cancelled()`` between steps (raises :class:`RunCancelled`). Bad
  pixels raise :class:`InputDecodeError` (HTTP 400, code 3). The return value is the
  envelope's ``data``: JSON-serialisable plain Python.
* :meth:`Model.run_batch` may be overridden to serve several requests in one forward
  pass (dynamic batching); each item succeeds or fails alone.
* Step batching: a model whose :attr:`Model.run_capacity` is above 1 takes that many
  runs at once (its slots in the worker pool) and offers a :class:`StepBatch`
  (:meth:`Model.step_batch`): the server then joins each run to that batch instead of
  calling :meth:`Model.run` on a thread of its own, and advances every run in it one
  step per call on the model thread pool (see ``runtime/step_loop.py``).

This module imports no torch, no Twisted.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from mortred_twisted.model_api.params import ParamSpec, validate_params

if TYPE_CHECKING:
    from mortred_twisted.model_api.input_limits import InputLimits


class ModelError(Exception):
    """Base class of errors a model raises on purpose."""


class SamplingDiverged(ModelError):
    """A sampler's run turned NaN or infinite: that run fails, its batch mates go on
    (both step engines raise it: ``models/diffusion/batching``,
    ``models/diffusers_pipelines/prompt_batch``)."""


class InvalidRequest(ModelError):
    """The envelope parsed but is not valid for this model (HTTP 422, code 52)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


class InputDecodeError(ModelError):
    """An input image is empty or cannot be decoded (HTTP 400, code 3)."""


class InputTooLarge(InvalidRequest):
    """The request's images exceed the model's input limits (HTTP 413, code 61):
    ``limit`` is the config key (``max_images``, ``max_pixels``), ``value`` its value
    (see :mod:`mortred_twisted.model_api.input_limits`)."""

    def __init__(self, field_name: str, message: str, *, limit: str, value: int) -> None:
        super().__init__(field_name, message)
        self.limit = limit
        self.value = value


class ModelLoadError(ModelError):
    """Weights or configuration cannot be loaded; the server stays not ready."""


class RunCancelled(ModelError):
    """The run noticed its cancellation flag between two steps and stopped."""


@dataclass(frozen=True)
class InferenceRequest:
    """One parsed request envelope.

    ``images`` hold the raw bytes decoded from base64 (not yet decoded as pictures:
    that is the model's business, on its worker thread). ``params`` is the
    per-model parameter mapping, normalised by :meth:`Model.validate`.
    """

    req_id: str
    images: tuple[bytes, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    #: params came as text fields (a multipart submit): scalars are parsed by type
    text_params: bool = False
    #: a job's result files come back inline (base64) rather than as URLs
    #: (``Prefer: return=inline``); kept on a shared store's wire
    inline_files: bool = False

    def with_params(self, params: Mapping[str, Any]) -> InferenceRequest:
        return replace(self, params=dict(params))


class RunContext:
    """Progress and cancellation channel between a running model and the server.

    Thread contract: created by the server, passed to :meth:`Model.run` on a worker
    thread; ``progress`` and ``check_cancelled`` are called from that thread, while
    ``cancel`` and ``last_progress`` may be called from any thread.
    """

    def __init__(self, on_progress: Callable[[int, int], None] | None = None) -> None:
        self._on_progress = on_progress
        self._cancelled = threading.Event()
        self._progress: tuple[int, int] | None = None
        #: the job this run serves (None on the sync path); set before the run starts
        self.job_id: str | None = None
        #: where the run's result files go (``sdk.outputs.FileSink``); None: inline
        self.result_files: Any = None
        #: called (worker thread) with each event an SDK model emits: (name, data)
        self.on_event: Callable[[str, Any], None] | None = None

    def event(self, name: str, data: Any) -> None:
        """Forward an event the model emitted (a preview, a streamed output)."""
        if self.on_event is not None:
            self.on_event(name, data)

    def progress(self, step: int, total: int) -> None:
        """Report that ``step`` of ``total`` steps are done."""
        self._progress = (step, total)
        if self._on_progress is not None:
            self._on_progress(step, total)

    @property
    def last_progress(self) -> tuple[int, int] | None:
        return self._progress

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check_cancelled(self) -> None:
        """Raise :class:`RunCancelled` if :meth:`cancel` was called."""
        if self._cancelled.is_set():
            raise RunCancelled("run cancelled")


class Model(abc.ABC):
    """A loaded model instance owned by one worker."""

    #: The parameters this model accepts in ``params``; unknown keys are rejected.
    params_schema: Sequence[ParamSpec] = ()
    #: Whether the model reads ``images`` (generative models only need a valid
    #: envelope; their pixels are ignored).
    uses_images: bool = True
    #: JSON schema of ``run``'s result (the envelope's ``data``), for the OpenAPI
    #: document; see :mod:`mortred_twisted.models.schemas`.
    output_schema: Mapping[str, Any] | None = None
    #: How many runs this instance takes at once: its slots in the worker pool. Above
    #: 1, :meth:`step_batch` must return the instance's batch.
    run_capacity: int = 1
    #: Images per request and pixels per image this instance accepts
    #: (:class:`~mortred_twisted.model_api.input_limits.InputLimits`), set from the model
    #: config when the registry builds it; None checks nothing.
    input_limits: InputLimits | None = None

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        """Check ``request`` cheaply and return it with normalised params.

        Runs on the reactor thread before admission. Raises :class:`InvalidRequest`,
        :class:`InputTooLarge` (too many images or pixels, from the images' headers:
        nothing is decoded) or :class:`InputDecodeError` (a header that cannot be
        read). An override must call this (or ``check_input_limits``) to keep the
        limits.
        """
        if self.uses_images and not request.images:
            raise InvalidRequest("images", "at least one image is required")
        if self.uses_images and self.input_limits is not None:
            from mortred_twisted.model_api.input_limits import check_input_limits

            check_input_limits(request.images, self.input_limits)
        return request.with_params(validate_params(self.params_schema, request.params))

    @abc.abstractmethod
    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        """Run inference for one request; return JSON-serialisable ``data``."""

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        """Run several requests; each entry is a result or the exception it raised.

        The default loops over :meth:`run`. Models with a real batched forward pass
        override it; a failing item must not fail its batch mates.
        """
        out: list[Any | BaseException] = []
        for request, ctx in zip(requests, ctxs, strict=True):
            try:
                out.append(self.run(request, ctx))
            except Exception as exc:
                out.append(exc)
        return out

    def step_batch(self) -> StepBatch | None:
        """The instance's own :class:`StepBatch` (one per instance), or None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once at shutdown from a non-reactor thread."""


class StepBatch(abc.ABC):
    """Runs of one model instance advanced together, one step per :meth:`step`.

    Thread contract: the server calls :meth:`join`, :meth:`step` and :meth:`abandon`
    from one thread at a time (its batch loop, on the model thread pool), never
    concurrently; the runs' contexts may be cancelled from any thread. Ownership: a
    run belongs to the batch from :meth:`join` until :meth:`step` (or
    :meth:`abandon`) reports it as left, exactly once. A run's failure (its scheduler
    raises, its numbers turn NaN, it is cancelled) is its own outcome: it leaves
    alone and the other runs go on.
    """

    @abc.abstractmethod
    def join(self, key: int, request: InferenceRequest, ctx: RunContext) -> None:
        """Prepare a run that takes part from the next :meth:`step` on.

        Raises (the run then never joined) when the request cannot run: cancelled
        already, bad params.
        """

    @abc.abstractmethod
    def step(self) -> list[tuple[int, Any | BaseException]]:
        """Advance every run by one step; return the runs that left, with their
        ``data`` (done) or the exception that ended them. Reports progress and
        checks cancellation per run, as :meth:`Model.run` does per step."""

    @abc.abstractmethod
    def abandon(self) -> list[int]:
        """Drop every run (after :meth:`step` itself failed); return their keys."""

    @property
    @abc.abstractmethod
    def active(self) -> int:
        """How many runs the batch holds."""


def step_batch_of(model: Model) -> StepBatch | None:
    """The model's step batch when it takes more than one run at once, else None."""
    if model.run_capacity <= 1:
        return None
    return model.step_batch()


ModelFactory = Callable[[Mapping[str, Any], Any], Model]
