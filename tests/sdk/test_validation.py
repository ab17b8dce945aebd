"""Requests checked against a declaration: the 422s, file references, coercion."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge, InvalidRequest
from mortred_twisted.model_api.input_limits import InputLimits
from mortred_twisted.sdk import File, Image, Input, ServedModel
from mortred_twisted.sdk.declaration import declare
from mortred_twisted.sdk.validation import FILE_REF, Upload, validate_inputs


def png(width: int = 4, height: int = 4) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


class Model(ServedModel):
    def predict(
        self,
        image: Image,
        amount: float = Input(1.0, ge=0.0, le=4.0),
        mode: str = Input("a", choices=["a", "b"]),
        steps: int = Input(3, ge=1, le=10),
        flag: bool = False,
        names: list[str] = Input([], max_items=2, min_length=1),
        doc: File | None = None,
    ) -> Image:
        raise NotImplementedError


DECL = declare(Model)
B64 = base64.b64encode(png()).decode()


def check(params: dict, images: tuple[bytes, ...] = (), **kw: object):
    return validate_inputs(DECL, params, images, **kw)  # type: ignore[arg-type]


def test_defaults_fill_in_and_files_become_references() -> None:
    """A valid request comes back complete, its bytes beside the params."""
    params, files = check({"image": B64, "amount": 2})
    assert params["amount"] == 2.0 and params["mode"] == "a" and params["steps"] == 3
    assert params["image"] == {FILE_REF: 0, "content_type": "image/png", "name": None}
    assert files == (png(),)
    assert params["doc"] is None and params["names"] == []


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({}, "params.image", "is required"),
        ({"image": B64, "amount": 5}, "params.amount", "must be <= 4.0"),
        ({"image": B64, "amount": "x"}, "params.amount", "must be a number"),
        ({"image": B64, "amount": float("nan")}, "params.amount", "finite"),
        ({"image": B64, "mode": "c"}, "params.mode", "must be one of"),
        ({"image": B64, "steps": 1.5}, "params.steps", "must be an integer"),
        ({"image": B64, "steps": True}, "params.steps", "must be an integer"),
        ({"image": B64, "flag": 1}, "params.flag", "must be a boolean"),
        ({"image": B64, "names": ["a", "b", "c"]}, "params.names", "at most 2 items"),
        ({"image": B64, "names": [""]}, "params.names[0]", "must be at least 1 character"),
        ({"image": B64, "names": "a"}, "params.names", "must be an array"),
        ({"image": B64, "stesp": 1}, "params.stesp", "did you mean 'steps'"),
        ({"image": "%%%"}, "params.image", "not valid base64"),
        ({"image": {"$file": 0}}, "params.image", "must be a base64 string"),
        ({"image": B64, "doc": ""}, "params.doc", "is empty"),
        ({"image": "data:text/plain;base64," + B64}, "params.image", "must be an image"),
        ({"image": "data:image/png," + B64}, "params.image", "must be base64"),
    ],
)
def test_every_bad_input_is_a_422_naming_the_input(params: dict, field: str, message: str) -> None:
    """Type, bound, choice, required, length, count and unknown key name params.<input>."""
    with pytest.raises(InvalidRequest) as info:
        check(params)
    assert info.value.field == field
    assert message in info.value.message


def test_a_data_uri_and_the_seed_envelope_images_fill_the_image_input() -> None:
    """data: URIs decode; images of the seed envelope go to the single Image input."""
    params, files = check({"image": f"data:image/png;base64,{B64}"})
    assert files == (png(),)
    params, files = check({}, images=(png(),))
    assert params["image"][FILE_REF] == 0 and files == (png(),)
    with pytest.raises(InvalidRequest, match=r"either as images or params\.image"):
        check({"image": B64}, images=(png(),))
    with pytest.raises(InvalidRequest, match="takes one image"):
        check({}, images=(png(), png()))


def test_images_are_checked_from_their_headers_against_the_limits() -> None:
    """Too many pixels is a 413 naming the input; an unreadable header a 400."""
    limits = InputLimits(max_images=4, max_pixels=100)
    with pytest.raises(InputTooLarge) as info:
        check({"image": base64.b64encode(png(20, 20)).decode()}, limits=limits)
    assert info.value.field == "params.image" and info.value.limit == "max_pixels"
    with pytest.raises(InputDecodeError, match=r"params\.image"):
        check({"image": base64.b64encode(b"\x89PNG\r\n\x1a\nbroken").decode()}, limits=limits)


def test_multipart_text_fields_are_parsed_by_the_declared_type() -> None:
    """A form's "2", "true" and a file part validate like JSON values would."""
    params, files = check(
        {"image": Upload(png(), "image/png", "a.png"), "amount": "2.5", "flag": "true",
         "steps": "4", "names": "x", "doc": Upload(b"hello", "text/plain", "d.txt")},
        from_text=True,
    )  # fmt: skip
    assert (params["amount"], params["flag"], params["steps"]) == (2.5, True, 4)
    assert params["names"] == ["x"]
    assert params["doc"] == {FILE_REF: 1, "content_type": "text/plain", "name": "d.txt"}
    assert files == (png(), b"hello")
    with pytest.raises(InvalidRequest, match="must be an integer"):
        check({"image": B64, "steps": "four"}, from_text=True)


def test_counts_in_messages_agree_with_their_nouns() -> None:
    """``at least 1 character`` (issue 36.4: it said ``1 characters``), ``at most 1
    item``; plural otherwise."""
    from mortred_twisted.sdk.validation import _count

    assert [_count(1, "character"), _count(2, "character"), _count(1, "item")] == [
        "1 character", "2 characters", "1 item",
    ]  # fmt: skip
    with pytest.raises(InvalidRequest) as info:
        check({"image": B64, "names": [""]})
    assert info.value.message.endswith("must be at least 1 character")
