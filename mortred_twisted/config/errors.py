"""Configuration errors, collected and reported all at once (pure)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
