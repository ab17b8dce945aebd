"""The float-tolerant answer comparison is strict about everything but float noise."""

from __future__ import annotations

import pytest

from mortred_twisted.testing.closeness import assert_json_close, json_close


def test_float_noise_passes_and_a_visible_difference_fails() -> None:
    base = {"class_id": 3, "top_k": [{"class_id": 7, "score": 0.005780225154012442}]}
    noisy = {"class_id": 3, "top_k": [{"class_id": 7, "score": 0.0057802279479801655}]}
    assert_json_close(noisy, base)
    off = {"class_id": 3, "top_k": [{"class_id": 7, "score": 0.0058}]}
    assert (
        json_close(off, base)
        == "$.top_k[0].score: 0.0058 != 0.005780225154012442 (rel 0.0001, abs 1e-05)"
    )


@pytest.mark.parametrize(
    ("actual", "expected", "where"),
    [
        ({"class_id": 4}, {"class_id": 3}, "$.class_id"),
        ({"label": "cat"}, {"label": "dog"}, "$.label"),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, "$: keys"),
        ([1.0, 2.0], [1.0], "$: length"),
        ({"n": 1}, {"n": 1.0}, "$.n"),
        ({"n": True}, {"n": 1}, "$.n"),
        ({"x": None}, {"x": 0.0}, "$.x"),
    ],
)
def test_everything_exact_by_construction_is_compared_exactly(
    actual: object, expected: object, where: str
) -> None:
    found = json_close(actual, expected)
    assert found is not None and found.startswith(where)
