"""Declarative validation of a model's ``params`` (pure Python, no torch).

A model lists :class:`ParamSpec` entries; :func:`validate_params` checks a request's
``params`` mapping against them, fills defaults and raises
:class:`~mortred_twisted.model_api.base.InvalidRequest` naming the field
(``params.<name>``) on the first problem: unknown key, wrong type, out of range.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParamSpec:
    """One accepted parameter.

    ``kind`` is ``int``, ``float``, ``bool`` or ``str``. ``minimum``/``maximum`` are
    inclusive bounds for numbers. ``default`` of ``None`` means "absent unless
    given". ``choices`` restricts strings (or numbers) to a set.
    """

    name: str
    kind: type
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    description: str = ""

    def json_schema(self) -> dict[str, Any]:
        """This parameter as a JSON-schema fragment (for the OpenAPI document)."""
        type_name = {int: "integer", float: "number", bool: "boolean", str: "string"}[self.kind]
        schema: dict[str, Any] = {"type": type_name}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.choices is not None:
            schema["enum"] = list(self.choices)
        if self.default is not None:
            schema["default"] = self.default
        if self.description:
            schema["description"] = self.description
        return schema


def _invalid(name: str, message: str) -> Exception:
    from mortred_twisted.model_api.base import InvalidRequest

    return InvalidRequest(f"params.{name}", message)


def _coerce(spec: ParamSpec, value: Any) -> Any:
    # bool is an int subclass in Python: reject it for numeric params explicitly.
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise _invalid(spec.name, "must be a boolean")
        return value
    if spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise _invalid(spec.name, "must be an integer")
    elif spec.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid(spec.name, "must be a number")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise _invalid(spec.name, "must be finite")
    elif spec.kind is str and not isinstance(value, str):
        raise _invalid(spec.name, "must be a string")
    if spec.minimum is not None and value < spec.minimum:
        raise _invalid(spec.name, f"must be >= {spec.minimum} (got {value})")
    if spec.maximum is not None and value > spec.maximum:
        raise _invalid(spec.name, f"must be <= {spec.maximum} (got {value})")
    if spec.choices is not None and value not in spec.choices:
        allowed = ", ".join(repr(c) for c in spec.choices)
        raise _invalid(spec.name, f"must be one of {allowed} (got {value!r})")
    return value


def validate_params(
    schema: Sequence[ParamSpec], params: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Return ``params`` checked against ``schema`` with defaults filled in."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        from mortred_twisted.model_api.base import InvalidRequest

        raise InvalidRequest("params", "must be a JSON object")
    by_name = {spec.name: spec for spec in schema}
    for key in params:
        if key not in by_name:
            hint = difflib.get_close_matches(str(key), list(by_name), n=1)
            suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
            known = ", ".join(sorted(by_name)) or "none"
            raise _invalid(str(key), f"unknown parameter{suffix}; accepted: {known}")
    out: dict[str, Any] = {}
    for spec in schema:
        if spec.name in params and params[spec.name] is not None:
            out[spec.name] = _coerce(spec, params[spec.name])
        elif spec.default is not None:
            out[spec.name] = spec.default
    return out
