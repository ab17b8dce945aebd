"""The Open Inference Protocol mapping, pure (issue 35 item 3): the binary framing
both ways and the checks on what a client says about its own bytes."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import pytest

from mortred_twisted.http.protocols.oip import (
    InferAsk,
    OipError,
    infer_answer,
    model_metadata,
    parse_infer,
    split_body,
)


def decl(*inputs: tuple[str, str, bool]) -> SimpleNamespace:
    items = [SimpleNamespace(name=n, kind=k, is_list=lst) for n, k, lst in inputs]
    out = SimpleNamespace(kind="object", is_list=False, fields=(
        ("images", SimpleNamespace(kind="image", is_list=True)),
        ("seed", SimpleNamespace(kind="int", is_list=False)),
    ))  # fmt: skip
    by_name = {i.name: i for i in items}
    return SimpleNamespace(inputs=items, output=out, input=by_name.get)


DECL = decl(("prompt", "str", False), ("seed", "int", False), ("scale", "float", False),
            ("flags", "bool", True), ("image", "image", False))  # fmt: skip


def test_metadata_maps_kinds_to_datatypes() -> None:
    meta = model_metadata("M", DECL)
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("prompt", "BYTES", [1]), ("seed", "INT64", [1]), ("scale", "FP32", [1]),
        ("flags", "BOOL", [-1]), ("image", "BYTES", [1]),
    ]  # fmt: skip
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("images", "BYTES", [-1]),
        ("seed", "INT64", [1]),
    ]


@pytest.mark.parametrize("header", [b"-1", b"abc", b"9999999999", b"", b"1e3"])
def test_a_header_length_that_is_not_a_count_or_lies(header: bytes) -> None:
    with pytest.raises(OipError):
        split_body(b'{"inputs": []}', header)


def test_binary_inputs_round_trip_and_framing_is_checked() -> None:
    head = {"inputs": [
        {"name": "prompt", "shape": [1], "datatype": "BYTES",
         "parameters": {"binary_data_size": 9}},
        {"name": "scale", "shape": [1], "datatype": "FP64", "parameters": {"binary_data_size": 8}},
        {"name": "flags", "shape": [2, 1], "datatype": "BOOL", "data": [[True], [False]]},
    ]}  # fmt: skip
    rest = struct.pack("<I", 5) + b"hello" + struct.pack("<d", 2.5)
    ask = parse_infer(head, rest, DECL)
    assert ask.params == {"prompt": "hello", "scale": 2.5, "flags": [True, False]}
    with pytest.raises(OipError, match="no input claims"):
        parse_infer(head, rest + b"x", DECL)
    bad_utf8 = struct.pack("<I", 5) + b"\xff\xfe\xfd\xfc\xfb" + struct.pack("<d", 2.5)
    with pytest.raises(OipError, match="prompt: not UTF-8"):
        parse_infer(head, bad_utf8, DECL)
    odd = {"inputs": [{"name": "seed", "shape": [1], "datatype": "INT64",
                       "parameters": {"binary_data_size": 7}}]}  # fmt: skip
    with pytest.raises(OipError, match="seed"):
        parse_infer(odd, b"\x00" * 7, DECL)
    twice = {"inputs": [{"name": "seed", "shape": [1], "datatype": "INT64", "data": [1]}] * 2}
    with pytest.raises(OipError, match="given twice"):
        parse_infer(twice, b"", DECL)
    huge = {"inputs": [{"name": "flags", "shape": [100000, 100000], "datatype": "BOOL",
                        "data": [True]}]}  # fmt: skip
    with pytest.raises(OipError, match="at most"):
        parse_infer(huge, b"", DECL)
    neg = {"inputs": [{"name": "seed", "shape": [1], "datatype": "INT64",
                       "parameters": {"binary_data_size": -4}}]}  # fmt: skip
    with pytest.raises(OipError, match="byte count"):
        parse_infer(neg, b"", DECL)


def test_outputs_binary_and_json() -> None:
    data = {"images": [{"base64": "aGk=", "content_type": "image/png"}], "seed": 7}
    ask = InferAsk(params={}, outputs={"images": True, "seed": False})
    body, head_length = infer_answer("M", "r", data, ask, True)
    assert head_length is not None
    head = json.loads(body[:head_length])
    assert head["id"] == "r" and head["outputs"][1] == {
        "name": "seed", "datatype": "INT64", "shape": [1], "data": [7]}  # fmt: skip
    assert body[head_length:] == struct.pack("<I", 2) + b"hi"
    plain, none = infer_answer("M", None, data, InferAsk(params={}), True)
    assert none is None and json.loads(plain)["outputs"][0]["data"] == ["hi"]
    with pytest.raises(OipError, match="not an output"):
        infer_answer("M", None, data, InferAsk(params={}, outputs={"nope": False}), True)
