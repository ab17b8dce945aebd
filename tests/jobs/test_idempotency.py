"""Idempotency-Key syntax and request fingerprints."""

from __future__ import annotations

import pytest

from mortred_twisted.jobs.idempotency import BadIdempotencyKey, check_key, fingerprint


@pytest.mark.parametrize(
    ("raw", "key"),
    [(None, None), (b"abc-123", "abc-123"), ('"8e03978e-40d5"', "8e03978e-40d5"),
     ("k" * 255, "k" * 255)],
)  # fmt: skip
def test_valid_keys(raw: bytes | str | None, key: str | None) -> None:
    """Absent means no key; a quoted or bare visible-ASCII key up to 255 chars is accepted."""
    assert check_key(raw) == key


@pytest.mark.parametrize(
    "raw", [b"", b'""', "k" * 256, "with space", "tab\there", "nul\x00", "☃".encode(), "caf\xe9"]
)
def test_invalid_keys_are_refused(raw: bytes | str) -> None:
    """Empty, too long, spaces, controls and non-ASCII keys are refused."""
    with pytest.raises(BadIdempotencyKey):
        check_key(raw)


def test_fingerprint_is_of_the_exact_bytes() -> None:
    """Equal bodies share a fingerprint; one byte of difference changes it."""
    assert fingerprint(b'{"a":1}') == fingerprint(b'{"a":1}')
    assert fingerprint(b'{"a":1}') != fingerprint(b'{"a": 1}')
