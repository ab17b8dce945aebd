"""Compare two JSON-shaped outputs where floats may differ in their last digits.

A model's answer computed in a batch and the same item computed alone go through
different CPU kernels (torch picks them by batch size and by the CPU's instruction
set: AVX2, AVX-512, AMX), so an unrounded float may differ in its last bits between
the two, and so may a float rounded to 6 places when it lies next to a rounding
boundary. What must not differ is everything exact by construction: the keys, the
lengths of lists, strings, booleans and integers (class ids, labels, sizes).

``json_close`` checks exactly that and names the first path that differs; the
conformance check (``_check_batch``: a batch against single runs) uses it, and so can
a user's own tests through ``assert_json_close``. Pure: no reactor, no torch.
"""

from __future__ import annotations

import math
from typing import Any

#: relative and absolute tolerance for floats: far above the last-bit noise of a
#: float32 forward pass (~1e-7 relative), far below any difference a user would see
REL = 1e-4
ABS = 1e-5


def json_close(
    actual: Any, expected: Any, *, rel: float = REL, abs_: float = ABS, path: str = "$"
) -> str | None:
    """The first path at which ``actual`` and ``expected`` differ beyond the float
    tolerance, with both values, or None when they agree.

    Floats are compared with ``math.isclose(rel_tol=rel, abs_tol=abs_)``; every other
    JSON value (and the type of each value: an int never matches a float) exactly.
    """
    if isinstance(expected, float) and not isinstance(expected, bool):
        if not isinstance(actual, float):
            return f"{path}: {actual!r} is not a float like {expected!r}"
        if math.isnan(expected) and math.isnan(actual):
            return None
        if math.isclose(actual, expected, rel_tol=rel, abs_tol=abs_):
            return None
        return f"{path}: {actual!r} != {expected!r} (rel {rel}, abs {abs_})"
    if type(actual) is not type(expected):
        return f"{path}: {type(actual).__name__} {actual!r} != {type(expected).__name__}"
    if isinstance(expected, dict):
        if list(actual) != list(expected):
            return f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            found = json_close(actual[key], expected[key], rel=rel, abs_=abs_, path=f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(expected, list | tuple):
        if len(actual) != len(expected):
            return f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = json_close(a, e, rel=rel, abs_=abs_, path=f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if actual != expected:
        return f"{path}: {actual!r} != {expected!r}"
    return None


def assert_json_close(actual: Any, expected: Any, *, rel: float = REL, abs_: float = ABS) -> None:
    """Fail with the first differing path unless the answers agree (see json_close)."""
    found = json_close(actual, expected, rel=rel, abs_=abs_)
    assert found is None, found
