"""Configuration errors, collected and reported all at once (pure)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigErrors(Exception):
    """Every problem found in one configuration, in file order.

    Raised once after the whole configuration was checked, so an operator fixes all
    problems in one edit instead of one per restart.
    """

    def __init__(self, source: str, problems: Iterable[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} configuration error(s):\n{lines}")


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """A ``" (did you mean 'x'?)"`` suffix for a near-miss key, else ``""``."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_value(
    where: str,
    value: Any,
    types: tuple[type, ...],
    bounds: tuple[float | None, float | None],
    problems: list[str],
) -> bool:
    """Type and inclusive range check of one config value; appends a problem and
    returns False when it fails. ``bool`` only passes where ``types`` lists it
    (TOML ``true`` is not the number 1)."""
    if isinstance(value, bool) and bool not in types:
        problems.append(f"{where}: expected a number, got a boolean")
        return False
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        problems.append(f"{where}: expected {names}, got {type(value).__name__}")
        return False
    lo, hi = bounds
    if lo is not None and value < lo:
        problems.append(f"{where}: must be >= {lo} (got {value})")
        return False
    if hi is not None and value > hi:
        problems.append(f"{where}: must be <= {hi} (got {value})")
        return False
    return True
