"""A small JSON-schema validator for the subset our OpenAPI documents use.

Enough to check a real answer against ``/openapi.json`` without a new dependency:
``type`` (with OpenAPI 3.0's ``nullable``), ``required``, ``properties``,
``additionalProperties``, ``items``, ``minItems``/``maxItems``, ``enum``,
``minimum``/``maximum``, ``pattern``, ``format: byte`` (strict base64), ``oneOf``
(exactly one), ``anyOf``, ``allOf`` and local ``$ref`` (``#/a/b``). A keyword
outside that subset raises ``NotImplementedError``, so a schema can never pass
because the validator skipped a rule it does not know.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

#: Keywords that carry no rule.
ANNOTATIONS = frozenset({"description", "default", "title", "example", "examples", "nullable"})
RULES = frozenset(
    {
        "$ref", "type", "required", "properties", "additionalProperties", "items",
        "minItems", "maxItems", "enum", "minimum", "maximum", "pattern", "format",
        "oneOf", "anyOf", "allOf",
    }
)  # fmt: skip

_TYPES: Mapping[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise NotImplementedError(f"only local $ref are supported, not {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _byte(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def errors(
    value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None, at: str = "$"
) -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"<json path>: <problem>"`` lines.

    ``root`` is the document local ``$ref`` are resolved against (default: ``schema``).
    """
    root = schema if root is None else root
    unknown = set(schema) - RULES - ANNOTATIONS
    if unknown:
        raise NotImplementedError(f"{at}: unsupported schema keywords {sorted(unknown)}")
    if value is None and schema.get("nullable"):
        return []
    if "$ref" in schema:
        return errors(value, _resolve(schema["$ref"], root), root, at)
    found: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        if kind not in _TYPES:
            raise NotImplementedError(f"{at}: unsupported type {kind!r}")
        if not _TYPES[kind](value):
            return [f"{at}: expected {kind}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{at}: {value!r:.60} not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{at}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{at}: {value} > maximum {schema['maximum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{at}: {value!r:.60} does not match {schema['pattern']!r}")
        fmt = schema.get("format")
        if fmt == "byte" and not _byte(value):
            found.append(f"{at}: not base64 (format byte)")
        elif fmt not in (None, "byte"):
            raise NotImplementedError(f"{at}: unsupported format {fmt!r}")
    if isinstance(value, dict):
        for name in schema.get("required", ()):
            if name not in value:
                found.append(f"{at}: missing required {name!r}")
        props = schema.get("properties", {})
        for name, item in value.items():
            if name in props:
                found += errors(item, props[name], root, f"{at}.{name}")
            else:
                extra = schema.get("additionalProperties", True)
                if extra is False:
                    found.append(f"{at}: unexpected property {name!r}")
                elif isinstance(extra, Mapping):
                    found += errors(item, extra, root, f"{at}.{name}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            found.append(f"{at}: {len(value)} items < minItems {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{at}: {len(value)} items > maxItems {schema['maxItems']}")
        if "items" in schema:
            for i, item in enumerate(value):
                found += errors(item, schema["items"], root, f"{at}[{i}]")
    for sub in schema.get("allOf", ()):
        found += errors(value, sub, root, at)
    if "anyOf" in schema:
        branches = [errors(value, sub, root, at) for sub in schema["anyOf"]]
        if all(branches):
            found.append(f"{at}: matches no anyOf branch: {branches}")
    if "oneOf" in schema:
        branches = [errors(value, sub, root, at) for sub in schema["oneOf"]]
        matched = sum(1 for b in branches if not b)
        if matched != 1:
            found.append(f"{at}: matches {matched} oneOf branches (need 1): {branches}")
    return found
