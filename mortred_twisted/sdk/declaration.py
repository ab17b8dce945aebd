"""What a served model declares, read from its ``predict`` signature (pure).

:func:`declare` inspects a :class:`~mortred_twisted.sdk.served.ServedModel` subclass
once, at load time, and returns its :class:`Declaration`: the inputs (the keyword
parameters of ``predict``, their types and :class:`Input` constraints), the output
kind, whether ``predict`` streams (a generator) and how it batches. Everything the
server needs before a worker runs is derived from the declaration: request
validation (:mod:`mortred_twisted.sdk.validation`), the JSON schemas of the OpenAPI
document and the UI form, the limits checked from the head. A declaration is plain
data and round-trips through JSON (:meth:`Declaration.to_json`), so a server whose
workers live in other processes never imports the user's module.

A declaration the SDK cannot serve raises :class:`DeclarationError` naming the model,
the parameter and the reason: an unsupported annotation, a default outside its
bounds or choices, a ``Context`` parameter under another name than ``ctx``,
``*args``/``**kwargs``, bounds that contradict each other.

This module imports no torch, no Twisted, no Pillow.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.sdk.context import Context
from mortred_twisted.sdk.media import File, Image

#: Scalar kinds an input or a list item may have.
SCALAR_KINDS = ("str", "int", "float", "bool")
#: Binary kinds (the bytes travel beside the params, see sdk/validation.py).
BINARY_KINDS = ("image", "file")
#: A list input without ``max_items`` takes at most this many items.
DEFAULT_MAX_ITEMS = 64

_PY_KINDS: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool"}
_MEDIA_KINDS: dict[Any, str] = {Image: "image", File: "file"}
_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}

_MISSING: Any = object()


class DeclarationError(ModelLoadError):
    """A model declaration the SDK cannot serve (a load error: the server stays not
    ready and says why)."""

    def __init__(self, model: str, parameter: str | None, reason: str) -> None:
        where = f"{model}.predict({parameter})" if parameter else model
        super().__init__(f"model {where}: {reason}")
        self.model = model
        self.parameter = parameter
        self.reason = reason


class Input:
    """Constraints of one input, given as the default of a ``predict`` parameter.

    ``default`` (positional) makes the input optional; without it the input is
    required. ``ge``/``le`` bound numbers (inclusive), ``choices`` restricts values,
    ``min_length``/``max_length`` bound strings, ``max_items`` bounds lists.
    ``only_when={"other": [values]}``: the input applies only while input ``other``
    has one of ``values`` (given otherwise: a 422; its default is then not filled in).
    """

    __slots__ = (
        "choices",
        "default",
        "description",
        "ge",
        "le",
        "max_items",
        "max_length",
        "min_length",
        "only_when",
    )

    def __init__(
        self,
        default: Any = _MISSING,
        *,
        description: str = "",
        ge: float | None = None,
        le: float | None = None,
        choices: Sequence[Any] | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        max_items: int | None = None,
        only_when: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        self.default = default
        self.only_when = dict(only_when) if only_when is not None else None
        self.description = description
        self.ge = ge
        self.le = le
        self.choices = tuple(choices) if choices is not None else None
        self.min_length = min_length
        self.max_length = max_length
        self.max_items = max_items

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def __repr__(self) -> str:
        shown = {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}
        if self.required:
            shown.pop("default", None)
        return f"Input({', '.join(f'{k}={v!r}' for k, v in sorted(shown.items()))})"


@dataclass(frozen=True)
class InputDecl:
    """One declared input (plain data; see :meth:`Declaration.to_json`)."""

    name: str
    kind: str  # one of SCALAR_KINDS + BINARY_KINDS
    is_list: bool = False
    required: bool = True
    default: Any = None
    description: str = ""
    ge: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None
    max_items: int | None = None
    #: (other input, its values under which this input applies), or None: always
    only_when: tuple[str, tuple[Any, ...]] | None = None

    @property
    def binary(self) -> bool:
        return self.kind in BINARY_KINDS

    def json_schema(self) -> dict[str, Any]:
        """This input as a JSON-schema fragment (OpenAPI, the UI form)."""
        if self.binary:
            item: dict[str, Any] = {
                "type": "string",
                "format": "binary" if self.kind == "file" else "byte",
                "contentMediaType": "image/*" if self.kind == "image" else None,
                "description": "base64, a data: URI, or a multipart/form-data part",
            }
            item = {k: v for k, v in item.items() if v is not None}
            item["x-mortred-kind"] = self.kind
        else:
            item = {"type": _JSON_TYPES[self.kind]}
            if self.ge is not None:
                item["minimum"] = self.ge
            if self.le is not None:
                item["maximum"] = self.le
            if self.choices is not None:
                item["enum"] = list(self.choices)
            if self.min_length is not None:
                item["minLength"] = self.min_length
            if self.max_length is not None:
                item["maxLength"] = self.max_length
        if self.is_list:
            schema: dict[str, Any] = {
                "type": "array",
                "items": item,
                "maxItems": self.max_items or DEFAULT_MAX_ITEMS,
            }
        else:
            schema = item
        if not self.required and self.default is not None:
            schema["default"] = list(self.default) if self.is_list else self.default
        if self.description:
            schema["description"] = self.description
        return schema


@dataclass(frozen=True)
class OutputDecl:
    """What ``predict`` returns: ``kind`` is ``json`` (any JSON value), a scalar kind,
    ``image``/``file``, ``object`` (a dataclass: ``fields`` names each field's
    :class:`OutputDecl`); ``is_list`` for lists of them."""

    kind: str = "json"
    is_list: bool = False
    fields: tuple[tuple[str, OutputDecl], ...] = ()

    def json_schema(self) -> dict[str, Any]:
        if self.kind in BINARY_KINDS:
            item: dict[str, Any] = {"$ref": "#/components/schemas/ResultFile"}
        elif self.kind in SCALAR_KINDS:
            item = {"type": _JSON_TYPES[self.kind]}
        elif self.kind == "object":
            item = {
                "type": "object",
                "required": [name for name, _ in self.fields],
                "properties": {name: out.json_schema() for name, out in self.fields},
            }
        else:
            item = {}
        return {"type": "array", "items": item} if self.is_list else item

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "is_list": self.is_list,
            "fields": [[name, out.to_json()] for name, out in self.fields],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OutputDecl:
        return cls(
            kind=str(doc["kind"]),
            is_list=bool(doc["is_list"]),
            fields=tuple((str(n), cls.from_json(o)) for n, o in doc.get("fields", ())),
        )


@dataclass(frozen=True)
class Declaration:
    """A served model's declaration (see the module docstring)."""

    name: str
    description: str
    inputs: tuple[InputDecl, ...]
    output: OutputDecl = field(default_factory=OutputDecl)
    #: ``predict`` is a generator: each yielded value is an ``output`` event; the
    #: result is the list of them.
    streams: bool = False
    #: ``predict`` takes the :class:`Context` as ``ctx``.
    takes_context: bool = False
    #: ``predict_batch`` is defined: the sync path may gather this many requests.
    max_batch_size: int = 1
    batch_wait_ms: float = 0.0
    #: the wire contract: "sdk" or "mortred-v1" (sdk/seed_contract.py)
    contract: str = "sdk"
    #: former input names still accepted: (old, new) pairs
    renamed: tuple[tuple[str, str], ...] = ()
    #: "mortred-v1": the JSON schema of the returned data (None: not described)
    output_schema: Mapping[str, Any] | None = None

    def input(self, name: str) -> InputDecl | None:
        for decl in self.inputs:
            if decl.name == name:
                return decl
        return None

    def resolve(self, name: str) -> InputDecl | None:
        """The input ``name`` names: a declared name, or a renamed input's old one."""
        for old, new in self.renamed:
            if old == name:
                return self.input(new)
        return self.input(name)

    @property
    def image_input(self) -> InputDecl | None:
        """The single ``Image``/``list[Image]`` input the seed envelope's ``images``
        fills, if there is exactly one."""
        found = [d for d in self.inputs if d.kind == "image"]
        return found[0] if len(found) == 1 else None

    def inputs_schema(self) -> dict[str, Any]:
        """``params`` as a JSON schema."""
        return {
            "type": "object",
            "additionalProperties": False,
            # an input that applies only when another has some value is required then
            "required": [d.name for d in self.inputs if d.required and d.only_when is None],
            "properties": {d.name: d.json_schema() for d in self.inputs},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputs": [dataclasses.asdict(d) for d in self.inputs],
            "output": self.output.to_json(),
            "streams": self.streams,
            "takes_context": self.takes_context,
            "max_batch_size": self.max_batch_size,
            "batch_wait_ms": self.batch_wait_ms,
            "contract": self.contract,
            "renamed": [list(pair) for pair in self.renamed],
            "output_schema": self.output_schema,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Declaration:
        inputs = []
        for raw in doc["inputs"]:
            values = dict(raw)
            if values.get("choices") is not None:
                values["choices"] = tuple(values["choices"])
            if values.get("is_list") and isinstance(values.get("default"), list):
                values["default"] = tuple(values["default"])
            if values.get("only_when") is not None:
                other, allowed = values["only_when"]
                values["only_when"] = (str(other), tuple(allowed))
            inputs.append(InputDecl(**values))
        return cls(
            name=str(doc["name"]),
            description=str(doc["description"]),
            inputs=tuple(inputs),
            output=OutputDecl.from_json(doc["output"]),
            streams=bool(doc["streams"]),
            takes_context=bool(doc["takes_context"]),
            max_batch_size=int(doc["max_batch_size"]),
            batch_wait_ms=float(doc["batch_wait_ms"]),
            contract=str(doc.get("contract", "sdk")),
            renamed=tuple((str(old), str(new)) for old, new in doc.get("renamed", ())),
            output_schema=doc.get("output_schema"),
        )


# -- reading a class ---------------------------------------------------------------


def _strip_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _input_kind(model: str, name: str, annotation: Any) -> tuple[str, bool]:
    annotation = _strip_optional(annotation)
    if annotation in (list, Sequence):
        raise DeclarationError(model, name, "a list input needs its item type (list[int])")
    origin = typing.get_origin(annotation)
    if origin in (list, Sequence, typing.List):  # noqa: UP006 - typing.List is accepted too
        args = typing.get_args(annotation)
        if len(args) != 1:
            raise DeclarationError(model, name, "a list input needs its item type (list[int])")
        item = _strip_optional(args[0])
        kind = _PY_KINDS.get(item) or _MEDIA_KINDS.get(item)
        if kind is None:
            raise DeclarationError(model, name, f"unsupported list item type {item!r}")
        return kind, True
    kind = _PY_KINDS.get(annotation) or _MEDIA_KINDS.get(annotation)
    if kind is None:
        raise DeclarationError(
            model,
            name,
            f"unsupported input type {annotation!r} (use str, int, float, bool, Image, File "
            "or a list of one of them)",
        )
    return kind, False


def _check_value(model: str, decl: InputDecl, value: Any, what: str) -> Any:
    """A default (or a choice) checked against the input's own constraints."""
    from mortred_twisted.model_api.base import InvalidRequest
    from mortred_twisted.sdk.validation import check_scalar

    try:
        return check_scalar(decl, value, f"params.{decl.name}")
    except InvalidRequest as exc:
        raise DeclarationError(model, decl.name, f"{what} {value!r}: {exc.message}") from None


def _input_decl(model: str, name: str, annotation: Any, spec: Input) -> InputDecl:
    kind, is_list = _input_kind(model, name, annotation)
    if spec.ge is not None and spec.le is not None and spec.ge > spec.le:
        raise DeclarationError(model, name, f"ge={spec.ge} is above le={spec.le}")
    numeric = kind in ("int", "float")
    if (spec.ge is not None or spec.le is not None) and not numeric:
        raise DeclarationError(model, name, f"ge/le bound numbers, not {kind}")
    if (spec.min_length is not None or spec.max_length is not None) and kind != "str":
        raise DeclarationError(model, name, f"min_length/max_length bound strings, not {kind}")
    if spec.max_items is not None and not is_list:
        raise DeclarationError(model, name, "max_items bounds lists only")
    if spec.max_items is not None and spec.max_items < 1:
        raise DeclarationError(model, name, "max_items must be at least 1")
    if spec.choices is not None and (kind in BINARY_KINDS or not spec.choices):
        raise DeclarationError(model, name, "choices must be a non-empty list of values")
    only_when = None
    if spec.only_when is not None:
        if len(spec.only_when) != 1:
            raise DeclarationError(model, name, "only_when names exactly one other input")
        ((other, allowed),) = spec.only_when.items()
        if other == name or isinstance(allowed, str) or not allowed:
            raise DeclarationError(model, name, "only_when={other: [values]} names another input")
        only_when = (str(other), tuple(allowed))
    for bound in ("min_length", "max_length"):
        value = getattr(spec, bound)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise DeclarationError(model, name, f"{bound} must be a non-negative integer")
    decl = InputDecl(
        name=name,
        kind=kind,
        is_list=is_list,
        required=spec.required,
        default=None,
        description=spec.description,
        ge=spec.ge,
        le=spec.le,
        choices=spec.choices,
        min_length=spec.min_length,
        max_length=spec.max_length,
        max_items=spec.max_items,
        only_when=only_when,
    )
    if spec.choices is not None:
        bare = dataclasses.replace(decl, choices=None)
        checked = tuple(_check_value(model, bare, c, "choice") for c in spec.choices)
        decl = dataclasses.replace(decl, choices=checked)
    if spec.required or spec.default is None:
        return decl
    if kind in BINARY_KINDS:
        raise DeclarationError(model, name, "an Image/File input's default can only be None")
    default = spec.default
    if is_list:
        if not isinstance(default, (list, tuple)):
            raise DeclarationError(model, name, f"default {default!r} is not a list")
        if len(default) > (spec.max_items or DEFAULT_MAX_ITEMS):
            raise DeclarationError(model, name, "default has more items than max_items")
        default = tuple(_check_value(model, decl, v, "default item") for v in default)
    else:
        default = _check_value(model, decl, default, "default")
    return dataclasses.replace(decl, default=default)


def _output_decl(model: str, annotation: Any, streams: bool) -> OutputDecl:
    if annotation is inspect.Signature.empty or annotation is Any or annotation is None:
        return OutputDecl()
    if streams:  # Iterator[X] / Generator[X, ...]: the declared item is X
        args = typing.get_args(annotation)
        return OutputDecl() if not args else _output_decl(model, args[0], streams=False)
    annotation = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin in (list, Sequence):
        args = typing.get_args(annotation)
        item = _output_decl(model, args[0], False) if args else OutputDecl()
        if item.is_list:
            return OutputDecl()  # nested lists: plain JSON, files inside still stored
        return dataclasses.replace(item, is_list=True)
    if annotation in _MEDIA_KINDS:
        return OutputDecl(kind=_MEDIA_KINDS[annotation])
    if annotation in _PY_KINDS:
        return OutputDecl(kind=_PY_KINDS[annotation])
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        try:
            hints = typing.get_type_hints(annotation)
        except Exception as exc:
            reason = f"cannot read output {annotation!r}: {exc}"
            raise DeclarationError(model, None, reason) from None
        fields = tuple(
            (f.name, _output_decl(model, hints.get(f.name, Any), False))
            for f in dataclasses.fields(annotation)
        )
        return OutputDecl(kind="object", fields=fields)
    if origin in (dict, Mapping) or annotation in (dict, list, Mapping):
        return OutputDecl()
    raise DeclarationError(
        model,
        None,
        f"unsupported output type {annotation!r} (use JSON values, Image, File, lists of "
        "them or a dataclass)",
    )


def declare(cls: type, name: str | None = None) -> Declaration:
    """Read ``cls``'s declaration (see the module docstring); raises
    :class:`DeclarationError`."""
    model = name or cls.__name__
    predict = getattr(cls, "predict", None)
    if predict is None or not callable(predict):
        raise DeclarationError(model, None, "defines no predict() method")
    try:
        hints = typing.get_type_hints(predict)
    except Exception as exc:
        raise DeclarationError(model, None, f"cannot read predict()'s annotations: {exc}") from None
    signature = inspect.signature(predict)
    params = list(signature.parameters.values())
    if not params or params[0].name != "self":
        raise DeclarationError(model, None, "predict must be a method (self first)")
    inputs: list[InputDecl] = []
    takes_context = False
    for param in params[1:]:
        annotation = hints.get(param.name, inspect.Signature.empty)
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise DeclarationError(model, param.name, "*args/**kwargs cannot be declared")
        if param.kind is param.POSITIONAL_ONLY:
            raise DeclarationError(model, param.name, "inputs are passed by name")
        is_context = annotation is Context or (
            isinstance(annotation, type) and issubclass(annotation, Context)
        )
        if param.name == "ctx" or is_context:
            if param.name != "ctx":
                raise DeclarationError(model, param.name, "the Context parameter must be named ctx")
            if annotation not in (inspect.Signature.empty, Context) and not is_context:
                raise DeclarationError(model, "ctx", "ctx is the Context; annotate it Context")
            takes_context = True
            continue
        if annotation is inspect.Signature.empty:
            raise DeclarationError(model, param.name, "needs a type annotation")
        default = param.default
        if default is inspect.Parameter.empty:
            spec = Input()
        elif isinstance(default, Input):
            spec = default
        else:
            spec = Input(default)
        inputs.append(_input_decl(model, param.name, annotation, spec))
    streams = inspect.isgeneratorfunction(predict)
    output = _output_decl(model, hints.get("return", inspect.Signature.empty), streams)
    has_batch = callable(getattr(cls, "predict_batch", None)) and (
        getattr(cls, "predict_batch", None) is not _base_predict_batch(cls)
    )
    max_batch = int(getattr(cls, "max_batch_size", 1)) if has_batch else 1
    wait_ms = float(getattr(cls, "batch_wait_ms", 0.0))
    if max_batch < 1 or wait_ms < 0:
        raise DeclarationError(model, None, "max_batch_size must be >= 1, batch_wait_ms >= 0")
    if has_batch and streams:
        raise DeclarationError(model, None, "a streaming predict cannot also batch")
    description = inspect.cleandoc(cls.__doc__) if cls.__doc__ else ""
    from mortred_twisted.sdk.constraints import check_declaration

    renamed = getattr(cls, "renamed_inputs", None) or {}
    schema = getattr(cls, "output_schema", None)
    return check_declaration(
        Declaration(
            name=model,
            description=description,
            inputs=tuple(inputs),
            output=output,
            streams=streams,
            takes_context=takes_context,
            max_batch_size=max_batch,
            batch_wait_ms=wait_ms,
            contract=str(getattr(cls, "contract", "sdk")),
            renamed=tuple((str(k), str(v)) for k, v in dict(renamed).items()),
            output_schema=dict(schema) if schema is not None else None,
        )
    )


def _base_predict_batch(cls: type) -> Any:
    from mortred_twisted.sdk.served import ServedModel

    return ServedModel.predict_batch if issubclass(cls, ServedModel) else None


def iter_binary(decl: Declaration) -> Iterator[InputDecl]:
    """The inputs whose values are bytes."""
    return (d for d in decl.inputs if d.binary)
