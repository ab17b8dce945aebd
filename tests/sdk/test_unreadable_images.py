"""Image inputs whose bytes are no picture (issue 36 item 3): abusive bytes (empty,
text, a PNG cut short in its header or in its pixels, a header declaring huge
dimensions) are answered naming the input and the accepted formats, never with
Pillow's ``<_io.BytesIO object at 0x…>``; before admission they are
``UnreadableImage`` (an ``InvalidRequest`` and an ``InputDecodeError``) in the
harness and HTTP 400 code 3 on the server, as docs/api.md says."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from typing import Any

import pytest
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge, InvalidRequest
from mortred_twisted.sdk import Image, ServedModel, UnreadableImage
from mortred_twisted.sdk.media import unreadable_reason
from mortred_twisted.testing import MemoryServer, ModelHarness

ACCEPTED = "accepted: PNG, JPEG, WebP, BMP, GIF or TIFF"


def png(width: int = 32, height: int = 32) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def declared_huge(width: int = 100_000, height: int = 100_000) -> bytes:
    """A 60-byte PNG whose header declares ``width`` x ``height`` (a bomb)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b""))
        + _chunk(b"IEND", b"")
    )


class Size(ServedModel):
    """Answers the picture's size (decoded in predict, on the worker)."""

    def predict(self, image: Image) -> dict[str, Any]:
        return {"size": list(image.to_pil().size)}


class Sizes(ServedModel):
    def predict(self, images: list[Image]) -> list[list[int]]:
        return [list(i.to_pil().size) for i in images]


TARGET = f"{__name__}:Size"

#: refused before admission, from the header: (bytes, what the message says)
UNREADABLE = {
    "empty": (b"", "(empty)"),
    "text": (b"hello, this is not a picture at all\n", "(not a known image format)"),
    "png signature then garbage": (b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 4, "(truncated)"),
    "png cut in its header": (png()[:20], "(truncated)"),
    "jpeg cut in its header": (b"\xff\xd8\xff\xe0\x00\x10JFIF", "(truncated)"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_unreadable_bytes_are_an_invalid_request_naming_the_input(case: str) -> None:
    """pytest.raises(InvalidRequest) catches it (as the docs' tests do); it names
    params.image, the reason and the formats, and no object repr."""
    data, reason = UNREADABLE[case]
    harness = ModelHarness(Size)
    with pytest.raises(InvalidRequest) as caught:
        harness.validate(image=data)
    error = caught.value
    assert isinstance(error, UnreadableImage) and isinstance(error, InputDecodeError)
    assert error.field == "params.image"
    assert error.message.startswith("not a readable image ") and reason in error.message
    assert error.message.endswith(ACCEPTED)
    assert "0x" not in str(error) and "BytesIO" not in str(error)
    assert harness.setups == 0  # refused without setup (no model ran)
    # run() refuses the same way, before predict
    with pytest.raises(UnreadableImage):
        harness.run(image=data)


def test_a_header_declaring_huge_dimensions_is_a_413_naming_the_input() -> None:
    """A decompression bomb costs a header parse: InputTooLarge, nothing decoded."""
    harness = ModelHarness(Size)
    with pytest.raises(InputTooLarge) as caught:
        harness.validate(image=declared_huge())
    assert caught.value.field == "params.image" and caught.value.limit == "max_pixels"
    with pytest.raises(InputTooLarge, match=r"params\.image: 5000x5000 = 25000000 pixels"):
        harness.validate(image=declared_huge(5000, 5000))


def test_a_list_item_is_named_by_its_index() -> None:
    with pytest.raises(UnreadableImage) as caught:
        ModelHarness(Sizes).validate(images=[png(), b"nope"])
    assert caught.value.field == "params.images[1]"


def test_pixels_that_do_not_decode_fail_in_predict_naming_the_input() -> None:
    """A PNG whose header reads but whose data is cut short passes admission; decoding
    it in predict raises InputDecodeError naming params.image (HTTP 400 on the sync
    path, a failed job on /jobs)."""
    cut = png(64, 64)
    cut = cut[: len(cut) // 2]
    harness = ModelHarness(Size)
    assert harness.validate(image=cut)["image"]["content_type"] == "image/png"
    with pytest.raises(InputDecodeError) as caught:
        harness.run(image=cut)
    assert str(caught.value) == f"params.image: not a readable image (truncated); {ACCEPTED}"


def test_reasons_never_carry_object_reprs() -> None:
    assert unreadable_reason("cannot decode image: broken data stream <x.Y object at 0xdead>") == (
        "broken data stream"
    )
    assert unreadable_reason("cannot identify image file <_io.BytesIO object at 0x7f>") == (
        "not a known image format"
    )


def _error(answer: Any) -> tuple[int, int, str]:
    """(HTTP status, business code, message) of a refusal: ``error`` on /jobs, the
    envelope's ``msg`` on the sync route."""
    doc = answer.json()
    return answer.code, doc["code"], doc["error"] if "error" in doc else doc["msg"]


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_the_server_answers_400_code_3_on_jobs_and_infer(case: str) -> None:
    """POST /jobs and the sync route refuse before admission with the docs' status."""
    data, reason = UNREADABLE[case]
    b64 = base64.b64encode(data).decode()
    with MemoryServer(TARGET) as server:
        status, code, text = _error(server.submit(image=b64))
        assert (status, code) == (400, 3)
        assert text.startswith("invalid input: params.image: not a readable image ")
        assert reason in text and text.endswith(ACCEPTED) and "0x" not in text
        answer = server.request("POST", "/infer", json={"params": {"image": b64}})
        assert _error(answer) == (status, code, text)


def test_a_multipart_part_that_is_no_picture_is_the_same_400() -> None:
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="x.png"\r\n'
        "Content-Type: image/png\r\n\r\nnot really a png\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    with MemoryServer(TARGET) as server:
        answer = server.request(
            "POST",
            "/jobs",
            body=body,
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        status, code, text = _error(answer)
        assert (status, code) == (400, 3)
        assert text.startswith("invalid input: params.image: not a readable image")


def test_the_server_answers_a_bomb_413_and_undecodable_pixels_400() -> None:
    with MemoryServer(TARGET) as server:
        bomb = base64.b64encode(declared_huge()).decode()
        status, code, text = _error(server.submit(image=bomb))
        assert (status, code) == (413, 61) and text.startswith("input too large: params.image: ")
        cut = png(64, 64)
        cut64 = base64.b64encode(cut[: len(cut) // 2]).decode()
        answer = server.request("POST", "/infer", json={"params": {"image": cut64}})
        status, code, text = _error(answer)
        assert (status, code) == (400, 3)
        assert text == f"invalid input: params.image: not a readable image (truncated); {ACCEPTED}"
        job = server.submit(image=cut64)
        assert job.code == 202
        ended = server.wait(job.json()["job_id"])
        assert ended["state"] == "failed"
        assert json.dumps(ended).count("params.image: not a readable image (truncated)") == 1
