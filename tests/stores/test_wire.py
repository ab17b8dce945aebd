"""The job request payload of the shared store: round trips, the previous format, and
payloads that do not add up (a damaged or foreign value in Redis must fail cleanly)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mortred_twisted.model_api.base import InferenceRequest
from mortred_twisted.stores.wire import MAGIC, decode_request, encode_request

REQ = InferenceRequest(
    req_id="r-☃", images=(b"\x00\xff\r\n", b"", b"x" * 70_000), params={"steps": 5, "s": [1, 2]}
)


def test_images_travel_raw_and_come_back_equal() -> None:
    payload = encode_request(REQ)
    assert payload.startswith(MAGIC)
    assert b"x" * 70_000 in payload  # not base64
    assert len(payload) < 70_200
    assert decode_request(payload) == REQ


@given(
    req_id=st.text(max_size=64),
    images=st.lists(st.binary(max_size=300), min_size=1, max_size=5),
    params=st.dictionaries(
        st.text(max_size=8),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=8), st.none()),
        max_size=5,
    ),
)
def test_any_request_round_trips(req_id: str, images: list[bytes], params: dict) -> None:
    req = InferenceRequest(req_id=req_id, images=tuple(images), params=params)
    assert decode_request(encode_request(req)) == req


def test_jobs_queued_by_the_previous_release_are_still_read() -> None:
    old = json.dumps(
        {"r": "r-1", "i": [base64.b64encode(b"\x00img").decode()], "p": {"a": 1}}
    ).encode()
    assert decode_request(old) == InferenceRequest("r-1", (b"\x00img",), {"a": 1})


def _frame(head: dict, tail: bytes = b"") -> bytes:
    raw = json.dumps(head).encode()
    return MAGIC + len(raw).to_bytes(4, "big") + raw + tail


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"PICKLE\x80\x04",
        MAGIC,
        MAGIC + (1000).to_bytes(4, "big") + b'{"r":"x"}',  # head longer than the payload
        _frame({"r": "x", "p": {}, "n": [5]}, b"abc"),  # image overruns
        _frame({"r": "x", "p": {}, "n": [1]}, b"ab"),  # trailing bytes
        _frame({"r": "x", "p": {}, "n": [-1]}, b""),
        _frame({"r": "x", "p": {}, "n": [True]}, b"a"),
        _frame({"r": "x", "p": {}, "n": ["1"]}, b"a"),
        _frame({"r": "x", "p": {}, "n": 1}, b"a"),
        _frame({"r": "x", "p": {}}, b""),  # no lengths
        MAGIC + (2).to_bytes(4, "big") + b"[]",  # a head that is not an object
        MAGIC + (2).to_bytes(4, "big") + b"\xff\xfe",  # not JSON
    ],
)
def test_a_payload_that_does_not_add_up_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_request(payload)


def test_the_inline_files_choice_travels_with_the_job() -> None:
    """``Prefer: return=inline`` (``inline_files``) survives the wire; without it the
    head carries no extra key."""
    inline = InferenceRequest(req_id="r", images=(b"x",), params={}, inline_files=True)
    assert decode_request(encode_request(inline)).inline_files is True
    plain = InferenceRequest(req_id="r", images=(b"x",), params={})
    assert b'"f"' not in encode_request(plain)
    assert decode_request(encode_request(plain)).inline_files is False
