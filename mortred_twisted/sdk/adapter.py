"""``SdkModel``: a user's :class:`~mortred_twisted.sdk.served.ServedModel` behind the
server's :class:`~mortred_twisted.model_api.base.Model` interface.

The worker pool, the job runner, the sync path, step batching and process isolation
see an ordinary ``Model``; this adapter translates:

* :meth:`SdkModel.validate` (reactor thread, before admission) checks the request
  against the declaration (:func:`~mortred_twisted.sdk.validation.validate_inputs`)
  and returns it with normalised params and the binary inputs' bytes as ``images``;
* :meth:`SdkModel.run` (worker thread) rebuilds the keyword arguments (file
  references become :class:`~mortred_twisted.sdk.media.Image`/``File`` values), calls
  ``predict`` with a :class:`~mortred_twisted.sdk.context.Context`, and encodes the
  output (result files through the run context's sink, see ``sdk/outputs.py``). A
  streaming ``predict`` sends each yielded value as an ``output`` event and returns
  the list of them; cancellation is checked between yields.
* :meth:`SdkModel.run_batch` calls ``predict_batch`` when the model defines it: one
  entry per request, an exception fails its own item only; a wrong-length answer
  fails every item with a message saying so.

A declaration with ``contract = "mortred-v1"`` (the built-in families) is served
with the seed's envelope instead (:mod:`mortred_twisted.sdk.seed_contract`): the
params keep the seed's rules and shape, ``images`` fill the image input, and the
returned data goes out as it is.

The instance may also step runs together (``run_capacity`` above 1 and
``step_batch()``, see :mod:`mortred_twisted.sdk.step_batching`) and check inputs
that need its configuration (``check_inputs(params)``, reactor thread, after the
declaration's checks; a validation twin has no instance, so ``predict`` repeats it).

A *validation twin* (no instance) validates exactly like the loaded model: the
declaration is plain data, so process-isolated workers send it to the server as
JSON and the server never imports the user's module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twisted.logger import Logger

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.sdk.context import Context
from mortred_twisted.sdk.declaration import Declaration
from mortred_twisted.sdk.media import File, Image
from mortred_twisted.sdk.outputs import OutputEncoder, encode_outcome
from mortred_twisted.sdk.seed_contract import SEED, image_input, param_specs, validate_seed
from mortred_twisted.sdk.validation import FILE_REF, validate_inputs

log = Logger(namespace="mortred.model")


class BatchLengthError(RuntimeError):
    """``predict_batch`` answered a different number of entries than it was given."""


class SdkModel(Model):
    """See the module docstring."""

    #: the seed envelope's ``images`` are optional for SDK models (inputs go by name)
    images_optional = True
    uses_images = False

    def __init__(
        self,
        declaration: Declaration,
        instance: Any | None = None,
        *,
        input_limits: Any = None,
    ) -> None:
        self.declaration = declaration
        self.instance = instance
        self.input_limits = input_limits
        self.seed = declaration.contract == SEED
        if self.seed:
            images = image_input(declaration)
            self.params_schema = param_specs(declaration)
            self.output_schema = declaration.output_schema
            self.uses_images = images is not None
            self.images_optional = images is None or not images.required
            self._image_name = images.name if images is not None else None
        else:
            self.output_schema = declaration.output.json_schema() or None
        self._check = getattr(instance, "check_inputs", None)
        capacity = int(getattr(instance, "run_capacity", 1) or 1)
        maker = getattr(instance, "step_batch", None)
        self.run_capacity = capacity if capacity > 1 and callable(maker) else 1
        self._batch = None
        if self.run_capacity > 1:
            from mortred_twisted.sdk.step_batching import SdkStepBatch

            self._batch = SdkStepBatch(self, maker())

    # -- reactor side ---------------------------------------------------------

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        checked = self._validate(request)
        if self._check is not None:
            self._check(checked.params)
        return checked

    def _validate(self, request: InferenceRequest) -> InferenceRequest:
        if self.seed:
            return validate_seed(self.declaration, self.params_schema, request, self.input_limits)
        params, files = validate_inputs(
            self.declaration,
            request.params,
            request.images,
            limits=self.input_limits,
            from_text=request.text_params,
        )
        return InferenceRequest(req_id=request.req_id, images=files, params=params)

    def validation_twin(self) -> SdkModel:
        return SdkModel(self.declaration, None, input_limits=self.input_limits)

    def __reduce__(self) -> tuple[Any, ...]:
        """A twin crosses a process boundary as its declaration's JSON (never the
        user's class: the receiving process does not import the user's module)."""
        if self.instance is not None:
            raise TypeError("a loaded SdkModel does not leave its process; send its twin")
        limits = self.input_limits
        packed = None if limits is None else (limits.max_images, limits.max_pixels)
        return (_twin_from_json, (json.dumps(self.declaration.to_json()), packed))

    # -- worker side ----------------------------------------------------------

    def step_batch(self) -> Any:
        return self._batch

    def _kwargs(self, request: InferenceRequest) -> dict[str, Any]:
        if self.seed:
            return self._seed_kwargs(request)
        kwargs: dict[str, Any] = {}
        for decl in self.declaration.inputs:
            value = request.params.get(decl.name)
            if decl.binary and value is not None:
                make = Image if decl.kind == "image" else File
                where = f"params.{decl.name}"
                if decl.is_list:
                    value = [
                        self._media(make, ref, request, f"{where}[{i}]")
                        for i, ref in enumerate(value)
                    ]
                else:
                    value = self._media(make, value, request, where)
            kwargs[decl.name] = value
        return kwargs

    def _seed_kwargs(self, request: InferenceRequest) -> dict[str, Any]:
        params = request.params
        kwargs = {spec.name: params.get(spec.name) for spec in self.params_schema}
        if self._image_name is not None:
            kwargs[self._image_name] = pictures = [Image(data) for data in request.images]
            for i, picture in enumerate(pictures):
                picture.source = f"images[{i}]"  # the seed envelope's name for them
        return kwargs

    def encoder(self, ctx: RunContext) -> Any:
        """How a run's outputs are encoded: result files through the run's sink, or
        (the seed contract) the data as it is."""
        return _VERBATIM if self.seed else OutputEncoder(ctx.result_files)

    @staticmethod
    def _media(
        make: type[File], ref: Mapping[str, Any], request: InferenceRequest, where: str
    ) -> File:
        value = make(request.images[ref[FILE_REF]], ref.get("content_type"), name=ref.get("name"))
        value.source = where  # a decoding error names the input
        return value

    def _context(self, ctx: RunContext, request_id: str, encoder: Any) -> Context:
        counts: dict[str, int] = {}

        def emit(name: str, value: Any) -> None:
            n = counts.get(name, 0)
            counts[name] = n + 1
            ctx.event(name, encoder.encode(value, f"{name}-{n}"))

        def write_log(message: str) -> None:
            log.info("[{req_id}] {message}", req_id=request_id, message=message)

        return Context(ctx, request_id=request_id, emit=emit, log=write_log)

    def _require_instance(self) -> Any:
        if self.instance is None:
            raise RuntimeError("a validation twin cannot run")
        return self.instance

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        instance = self._require_instance()
        encoder = self.encoder(ctx)
        kwargs = self._kwargs(request)
        if self.declaration.takes_context:
            kwargs["ctx"] = self._context(ctx, request.req_id, encoder)
        ctx.check_cancelled()
        out = instance.predict(**kwargs)
        if not self.declaration.streams:
            return encoder.encode(out)
        results = []
        try:
            for i, item in enumerate(out):
                data = encoder.encode(item, f"output-{i}")
                results.append(data)
                ctx.event("output", data)
                ctx.check_cancelled()
        finally:
            close = getattr(out, "close", None)
            if close is not None:
                close()  # runs the generator's finally blocks when we stop early
        return results

    def run_batch(
        self, requests: Sequence[InferenceRequest], ctxs: Sequence[RunContext]
    ) -> list[Any | BaseException]:
        together = getattr(self.instance, "predict_together", None)
        if together is not None and len(requests) > 1:
            # several requests in one call, each with its own context (its cancel,
            # its progress, its events), unlike predict_batch's one context
            encoders = [self.encoder(ctx) for ctx in ctxs]
            run_ctxs = [
                self._context(ctx, request.req_id, encoder)
                for ctx, request, encoder in zip(ctxs, requests, encoders, strict=True)
            ]
            items = [self._kwargs(request) for request in requests]
            return _batch_outcomes("predict_together", lambda: together(run_ctxs, items), encoders)
        if self.declaration.max_batch_size <= 1 or len(requests) == 1:
            return super().run_batch(requests, ctxs)
        instance = self._require_instance()
        encoders = [self.encoder(ctx) for ctx in ctxs]
        items = [self._kwargs(request) for request in requests]
        ctx = Context(_BatchRunContext(ctxs), request_id=",".join(r.req_id for r in requests))
        batch = instance.predict_batch
        return _batch_outcomes("predict_batch", lambda: batch(ctx, items), encoders)

    def close(self) -> None:
        if self.instance is not None:
            self.instance.close()


def _batch_outcomes(
    name: str, call: Callable[[], Any], encoders: Sequence[Any]
) -> list[Any | BaseException]:
    """``call()``'s entries, one per item, each encoded alone; the call's own failure,
    or an answer of the wrong length, fails every item (saying so)."""
    try:
        outputs = list(call())
    except Exception as exc:
        return [exc for _ in encoders]
    if len(outputs) != len(encoders):
        error = BatchLengthError(
            f"{name} returned {len(outputs)} entries for {len(encoders)} items"
        )
        return [error for _ in encoders]
    return [encode_outcome(e, out) for out, e in zip(outputs, encoders, strict=True)]


class _Verbatim:
    """The seed contract's encoder: the data goes out as the model returned it."""

    @staticmethod
    def encode(value: Any, stem: str = "output") -> Any:
        return value


_VERBATIM = _Verbatim()


def _twin_from_json(
    declaration_json: str, limits: tuple[int | None, int | None] | None
) -> SdkModel:
    from mortred_twisted.model_api.input_limits import InputLimits

    declaration = Declaration.from_json(json.loads(declaration_json))
    input_limits = None if limits is None else InputLimits(*limits)
    return SdkModel(declaration, None, input_limits=input_limits)


class _BatchRunContext(RunContext):
    """The run context of a batch: progress goes to every item; cancelled when every
    item is (a batch mate's cancel must not stop the others)."""

    def __init__(self, ctxs: Sequence[RunContext]) -> None:
        super().__init__()
        self._ctxs = list(ctxs)

    def progress(self, step: int, total: int) -> None:
        super().progress(step, total)
        for ctx in self._ctxs:
            ctx.progress(step, total)

    @property
    def cancelled(self) -> bool:
        return all(ctx.cancelled for ctx in self._ctxs)

    def check_cancelled(self) -> None:
        if self.cancelled:
            self._ctxs[0].check_cancelled()
