"""``ModelHarness``: a served model run in process, as the server would run it.

No reactor, no sockets, no Docker: the harness loads a declaration once (a
:class:`~mortred_twisted.sdk.ServedModel` subclass, ``package.module:Class`` or
``path/to/file.py:Class``, with its options), validates inputs with the server's own
code (:meth:`SdkModel.validate`: the same 422 messages) and runs ``predict`` through
the server's adapter (:class:`~mortred_twisted.sdk.adapter.SdkModel`) with a run
context that records everything a run tells the server::

    harness = ModelHarness("models/sharpen.py:Sharpen", options={"radius": 2})
    result = harness.run(image=Path("cat.png"), amount=2.0)
    result.output                    # the envelope's data, as a client reads it
    result.files["output.png"]       # a result file's bytes
    result.progress, result.events   # [(1, 10), ...], [("preview", {...}), ...]
    harness.run(image=..., cancel_at_step=3)   # raises RunCancelled

Inputs are Python values: scalars as they are; an ``Image``/``File`` input takes an
:class:`~mortred_twisted.sdk.Image`/``File``, ``bytes``, a :class:`pathlib.Path` (or
a ``str`` naming an existing file), a base64 string, a ``data:`` URI, a Pillow
picture or a numpy array (both sent as PNG).

Contract: ``setup`` runs once, on first use of an instance (:meth:`validate` never
needs it: validation reads the declaration only). One harness runs one call at a
time (``predict`` runs on the calling thread); the results are plain data.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InvalidRequest,
    RunCancelled,
    RunContext,
)
from mortred_twisted.model_api.input_limits import split_input_limits
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.sdk.declaration import Declaration
from mortred_twisted.sdk.loading import declaration_of, load_served_class
from mortred_twisted.sdk.media import File, Image
from mortred_twisted.sdk.seed_contract import SEED
from mortred_twisted.sdk.validation import Upload, decode_text

Target = type | str

#: The job id result-file URLs name in a harness run.
HARNESS_JOB_ID = "job_harness"


def load_target(target: Target, base: Path | None = None) -> type:
    """The ServedModel class ``target`` names (a class is returned as is); a relative
    ``file.py`` is taken from ``base`` (default: the current directory). Raises
    :class:`~mortred_twisted.model_api.base.ModelLoadError`."""
    if isinstance(target, type):
        from mortred_twisted.sdk.served import ServedModel

        if not issubclass(target, ServedModel):
            from mortred_twisted.model_api.base import ModelLoadError

            raise ModelLoadError(f"{target!r} is not a mortred_twisted.sdk.ServedModel subclass")
        return target
    return load_served_class(target, base)


def target_name(target: Target) -> str:
    """``target`` as a ``[model] type`` string."""
    if isinstance(target, type):
        return f"{target.__module__}:{target.__qualname__}"
    return target


class MemoryFiles:
    """A result-file sink that keeps the bytes (``sdk.outputs.FileSink``)."""

    def __init__(self, job_id: str = HARNESS_JOB_ID) -> None:
        self.url_prefix = f"/jobs/{job_id}/files/"
        self.files: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}

    def put(self, name: str, data: bytes, content_type: str) -> None:
        self.files[name] = bytes(data)
        self.content_types[name] = content_type


@dataclass
class RunResult:
    """What one run told the server, and what a client would read back.

    ``output`` is the envelope's ``data`` after a JSON round trip (result files are
    described by ``{"url", "name", "content_type", "size", "sha256"}``, their bytes
    in ``files``); ``error`` the exception that ended the run (then ``output`` is
    None). ``progress`` lists every ``(step, total)``, ``events`` every
    ``(name, data)`` the model emitted (a streaming ``predict``'s ``output`` events
    included; ``ctx.log`` lines go to the log, as on the server). ``cancel_at_step``: the step after
    which the harness cancelled the run (None: never).
    """

    output: Any = None
    error: BaseException | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    content_types: dict[str, str] = field(default_factory=dict)
    progress: list[tuple[int, int]] = field(default_factory=list)
    events: list[tuple[str, Any]] = field(default_factory=list)
    cancel_at_step: int | None = None
    #: progress reports that came after the cancel was asked
    progress_after_cancel: int = 0
    #: ``predict`` returned normally although the run was cancelled (the server
    #: discards such a result: the job ends ``cancelled``)
    returned_after_cancel: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cancelled(self) -> bool:
        return isinstance(self.error, RunCancelled)

    def file(self, name: str) -> File:
        """Result file ``name`` as an :class:`Image` (an image type) or :class:`File`."""
        content_type = self.content_types[name]
        make = Image if content_type.startswith("image/") else File
        return make(self.files[name], content_type, name=name)

    def events_named(self, name: str) -> list[Any]:
        return [data for event, data in self.events if event == name]


class _Recorder(RunContext):
    """A run context that records progress and events (worker thread)."""

    def __init__(self, result: RunResult, cancel_at_step: int | None, job_id: str) -> None:
        super().__init__()
        self._result = result
        self._cancel_at = cancel_at_step
        self.job_id = job_id
        sink = MemoryFiles(job_id)
        self.result_files = sink
        result.files = sink.files
        result.content_types = sink.content_types
        result.cancel_at_step = cancel_at_step
        self.on_event = lambda name, data: result.events.append((name, data))
        if cancel_at_step is not None and cancel_at_step <= 0:
            self.cancel()

    def progress(self, step: int, total: int) -> None:
        super().progress(step, total)
        if self.cancelled:
            self._result.progress_after_cancel += 1
        self._result.progress.append((step, total))
        if self._cancel_at is not None and step >= self._cancel_at:
            self.cancel()


def as_media(value: Any) -> Any:
    """A Pillow picture or a numpy array as a PNG :class:`Image`; other values as
    they are."""
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        return Image.from_pil(value)
    if hasattr(value, "__array_interface__") and hasattr(value, "shape"):  # numpy
        return Image.from_array(value)
    return value


def as_input(value: Any, where: str) -> Any:
    """A Python value for a binary input as the server's validator takes it."""
    value = as_media(value)
    if isinstance(value, File):
        return Upload(value.read(), value.content_type, value.name)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Upload(bytes(value))
    if isinstance(value, os.PathLike) or (
        isinstance(value, str) and "\n" not in value and len(value) < 4096 and _is_file(value)
    ):
        path = Path(value)
        if not path.is_file():
            raise InvalidRequest(where, f"file not found: {path}")
        return Upload(path.read_bytes(), None, path.name)
    return value  # base64, a data: URI, or something the validator refuses


def _seed_image(value: Any, where: str) -> bytes:
    """One picture of a seed-envelope model as the envelope's ``images`` carry it."""
    if isinstance(value, Upload):
        return value.data
    if isinstance(value, str):  # base64 or a data: URI, as the envelope sends it
        return decode_text(value, where)[0]
    return value


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


class ModelHarness:
    """See the module docstring. ``options`` are the ``[model]`` options (without
    ``type``); ``root`` the model's root for relative weight paths (default: the
    current directory); ``base`` the folder a relative ``file.py`` target is taken
    from."""

    def __init__(
        self,
        target: Target,
        options: Mapping[str, Any] | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        base: str | os.PathLike[str] | None = None,
    ) -> None:
        self.target = target_name(target)
        self.cls = load_target(target, Path(base) if base is not None else None)
        self.declaration: Declaration = declaration_of(self.cls)
        self.limits, self.options = split_input_limits(self.target, dict(options or {}))
        self.root = Path(root) if root is not None else Path.cwd()
        self._twin = SdkModel(self.declaration, None, input_limits=self.limits)
        self._model: SdkModel | None = None
        self._lock = threading.Lock()
        self._runs = 0
        #: how many times ``setup`` ran (at most once per harness)
        self.setups = 0

    # -- validation -------------------------------------------------------------

    def _request(self, inputs: Mapping[str, Any], req_id: str) -> InferenceRequest:
        seed = self.declaration.contract == SEED
        params: dict[str, Any] = {}
        images: tuple[bytes, ...] = ()
        for name, value in inputs.items():
            decl = self.declaration.resolve(name)  # an old name of a renamed input too
            if decl is not None and decl.binary and value is not None:
                where = f"params.{name}"
                if decl.is_list and isinstance(value, (list, tuple)):
                    value = [as_input(v, f"{where}[{i}]") for i, v in enumerate(value)]
                else:
                    value = as_input(value, where)
                if seed:  # the seed envelope: the pictures travel as its images
                    items = value if isinstance(value, list) else [value]
                    images = tuple(_seed_image(v, where) for v in items)
                    continue
            params[name] = value
        return InferenceRequest(req_id=req_id, images=images, params=params)

    @property
    def _validator(self) -> SdkModel:
        """The set-up model once there is one (its declaration may be refined by its
        configuration, ``configure_inputs``), else the class's validation twin."""
        return self._model if self._model is not None else self._twin

    def validate(self, params: Mapping[str, Any] | None = None, **inputs: Any) -> dict[str, Any]:
        """The normalised params (defaults filled in; binary inputs as file references),
        checked exactly as the server checks a submit: raises
        :class:`~mortred_twisted.model_api.base.InvalidRequest` (``field``, ``message``;
        the server answers 422 ``"invalid request: <field>: <message>"``), or one of
        its kinds with another status: ``InputTooLarge`` (413) and
        :class:`~mortred_twisted.sdk.media.UnreadableImage` (400, code 3: an image
        input that is empty, not an accepted format or cut short; also an
        ``InputDecodeError``). Never runs ``setup``."""
        merged = {**(params or {}), **inputs}
        return dict(self._validator.validate(self._request(merged, "validate")).params)

    # -- runs ---------------------------------------------------------------------

    @property
    def model(self) -> SdkModel:
        """The set-up model (``setup`` runs on first use)."""
        with self._lock:
            if self._model is None:
                from mortred_twisted.sdk.loading import build_sdk_model

                self._model = build_sdk_model(
                    self.cls, self.options, self.root, input_limits=self.limits
                )
                self.setups += 1
            return self._model

    def _next_id(self) -> str:
        self._runs += 1
        return f"req_harness_{self._runs}"

    def attempt(self, cancel_at_step: int | None = None, **inputs: Any) -> RunResult:
        """One run, its outcome recorded (a validation or model error is in
        ``error``, never raised). ``cancel_at_step``: cancel the run once it reports
        progress ``step >= N`` (0: cancelled before ``predict`` starts), as a client's
        ``DELETE /jobs/{id}`` does."""
        result = RunResult()
        req_id = self._next_id()
        try:
            request = self._validator.validate(self._request(inputs, req_id))
        except Exception as exc:
            result.error = exc
            return result
        ctx = _Recorder(result, cancel_at_step, HARNESS_JOB_ID)
        try:
            data = self.model.run(request, ctx)
            result.output = json.loads(json.dumps(data))
        except Exception as exc:
            result.error = exc
            return result
        if ctx.cancelled:  # the server discards a result that comes after a cancel
            result.output = None
            result.returned_after_cancel = True
            result.error = RunCancelled(
                f"cancelled at step {cancel_at_step}; predict returned after the cancel"
            )
        return result

    def run(self, cancel_at_step: int | None = None, **inputs: Any) -> RunResult:
        """One run (see :meth:`attempt`); raises what ended it (``InvalidRequest``,
        ``RunCancelled`` after ``cancel_at_step``, the model's own error) with the
        :class:`RunResult` as its ``run`` attribute."""
        result = self.attempt(cancel_at_step=cancel_at_step, **inputs)
        if result.error is not None:
            error = result.error
            error.run = result  # type: ignore[attr-defined]
            raise error
        return result

    def run_batch(
        self, items: Sequence[Mapping[str, Any]], *, cancel: Sequence[int] = ()
    ) -> list[RunResult]:
        """Several requests in one call, as the sync path batches them
        (``predict_batch`` when the model defines it): one :class:`RunResult` per
        item, in order, each with its own output, files or error (a request that
        fails validation fails alone and is not passed to the model). ``cancel``:
        indexes of items cancelled before the batch runs."""
        results = [RunResult() for _ in items]
        requests, ctxs, slots = [], [], []
        for i, inputs in enumerate(items):
            try:
                request = self._validator.validate(self._request(inputs, self._next_id()))
            except Exception as exc:
                results[i].error = exc
                continue
            ctx = _Recorder(results[i], 0 if i in cancel else None, f"{HARNESS_JOB_ID}_{i}")
            requests.append(request)
            ctxs.append(ctx)
            slots.append(i)
        if requests:
            outputs = self.model.run_batch(requests, ctxs)
            for i, out in zip(slots, outputs, strict=True):
                if isinstance(out, BaseException):
                    results[i].error = out
                    continue
                try:
                    results[i].output = json.loads(json.dumps(out))
                except (TypeError, ValueError) as exc:
                    results[i].error = exc
        return results

    def close(self) -> None:
        """Run the model's ``close`` (if it was set up)."""
        with self._lock:
            model, self._model = self._model, None
        if model is not None:
            model.close()

    def __enter__(self) -> ModelHarness:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def inputs_from_pairs(
    declaration: Declaration, pairs: Sequence[str], read: Callable[[str], bytes] | None = None
) -> dict[str, Any]:
    """``name=value`` pairs (a command line's ``-i``) as harness inputs: ``name=@path``
    is a file's bytes; a ``str`` input keeps its text; other values are JSON when they
    parse (``2``, ``true``, ``[1, 2]``) and text otherwise. A name given twice makes
    a list. Raises ValueError for a pair without ``=``."""
    read = read or (lambda p: Path(p).expanduser().read_bytes())
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"input {pair!r}: give name=value (or name=@file)")
        decl = declaration.resolve(name)
        value: Any
        if text.startswith("@"):
            path = text[1:]
            data = read(path)
            value = (
                Image(data, name=Path(path).name)
                if decl is not None and decl.kind == "image"
                else (File(data, name=Path(path).name))
            )
        elif decl is not None and decl.kind == "str" and not decl.is_list:
            value = text
        else:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        if name in out:
            previous = out[name]
            out[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        elif decl is not None and decl.is_list and not isinstance(value, list):
            out[name] = [value]
        else:
            out[name] = value
    return out
