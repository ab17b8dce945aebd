"""How a run's output differs from what its model declared (pure; used by the
conformance check): the kind of each value, file descriptions whose bytes were stored
with a matching size and sha256, a streaming model's output events, monotone progress."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from mortred_twisted.sdk.declaration import Declaration, OutputDecl
from mortred_twisted.testing.harness import RunResult


def output_problems(decl: OutputDecl, value: Any, result: RunResult, where: str) -> list[str]:
    """How ``value`` (JSON, files described) differs from the declared output."""
    if decl.is_list:
        if not isinstance(value, list):
            return [f"{where}: declared a list, got {type(value).__name__}"]
        item = replace(decl, is_list=False)
        return [
            p
            for i, v in enumerate(value)
            for p in output_problems(item, v, result, f"{where}[{i}]")
        ]
    kind = decl.kind
    if kind in ("image", "file"):
        if not isinstance(value, dict) or "sha256" not in value or "content_type" not in value:
            return [f"{where}: declared {kind}, got {str(value)[:80]!r} (not a file description)"]
        problems = []
        if kind == "image" and not str(value["content_type"]).startswith("image/"):
            problems.append(f"{where}: declared an image, got {value['content_type']}")
        data = result.files.get(value.get("name", ""))
        if "url" in value and data is None:
            problems.append(f"{where}: file {value.get('name')!r} was described but not stored")
        if data is not None and (
            len(data) != value.get("size") or hashlib.sha256(data).hexdigest() != value["sha256"]
        ):
            problems.append(f"{where}: file {value['name']!r} does not match its size/sha256")
        return problems
    expected = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}.get(kind)
    if expected is not None:
        if not isinstance(value, expected) or (kind != "bool" and isinstance(value, bool)):
            return [f"{where}: declared {kind}, got {type(value).__name__}"]
        return []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: declared a dataclass, got {type(value).__name__}"]
        names = [name for name, _ in decl.fields]
        if sorted(value) != sorted(names):
            return [f"{where}: fields {sorted(value)} are not the declared {sorted(names)}"]
        return [
            p
            for name, out in decl.fields
            for p in output_problems(out, value[name], result, f"{where}.{name}")
        ]
    return []  # json: any JSON value


def result_problems(declaration: Declaration, result: RunResult) -> list[str]:
    if not declaration.streams:
        return output_problems(declaration.output, result.output, result, "output")
    if not isinstance(result.output, list):
        return [
            f"output: a streaming predict's result is a list, got {type(result.output).__name__}"
        ]
    problems = [
        p
        for i, item in enumerate(result.output)
        for p in output_problems(declaration.output, item, result, f"output[{i}]")
    ]
    if result.events_named("output") != result.output:
        problems.append("output: the output events are not the result's items")
    return problems


def monotone(progress: list[tuple[int, int]]) -> str | None:
    done = -1.0
    for step, total in progress:
        fraction = step / total if total else 1.0
        if fraction < done:
            return f"progress went back: {progress}"
        done = fraction
    return None
