"""multipart/form-data submits: parts, fields, envelope fields, and hostile bodies."""

from __future__ import annotations

import pytest

from mortred_twisted.http.envelope import parse_form_envelope
from mortred_twisted.http.errors import ApiError
from mortred_twisted.http.multipart import MAX_PARTS, form_envelope, parse_form
from mortred_twisted.sdk.validation import Upload

CT = "multipart/form-data; boundary=XyZ"


def part(name: str, value: bytes, filename: str | None = None, ctype: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"Content-Disposition: {disposition}\r\n"
    if ctype:
        head += f"Content-Type: {ctype}\r\n"
    return b"--XyZ\r\n" + head.encode() + b"\r\n" + value + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--XyZ--\r\n"


def test_fields_files_and_the_params_part_make_one_request() -> None:
    """File parts keep their bytes and type; fields and a params JSON part merge."""
    raw = body(
        part("amount", b"2"),
        part("image", b"\x89PNG-bytes\r\n--not-a-boundary", "a.png", "image/png"),
        part("params", b'{"mode": "b"}', ctype="application/json"),
        part("tags", b"x"),
        part("tags", b"y"),
        part("req_id", b"r-7"),
        part("priority", b"high"),
    )
    job_fields: dict = {}
    request = parse_form_envelope(raw, CT, None, job_fields)
    assert request.req_id == "r-7" and request.text_params
    assert request.params["amount"] == "2" and request.params["mode"] == "b"
    assert request.params["tags"] == ["x", "y"]
    assert request.params["image"] == Upload(
        b"\x89PNG-bytes\r\n--not-a-boundary", "image/png", "a.png"
    )
    assert job_fields == {"priority": "high"}


def test_images_parts_fill_the_seed_envelope_images() -> None:
    """Parts named images become the request's images, in order."""
    request = parse_form_envelope(body(part("images", b"A", "a"), part("images", b"B", "b")), CT)
    assert request.images == (b"A", b"B")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (part("a", b"1"), "closing boundary"),
        (b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--", "name="),
        (b"--XyZ\r\nNoColonHere\r\n\r\nx\r\n--XyZ--", "malformed header"),
        (
            b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n"
            + b"X: "
            + b"y" * 9000
            + b"\r\n\r\nv\r\n--XyZ--",
            "headers over",
        ),
        (body(*[part(f"f{i}", b"1") for i in range(MAX_PARTS + 1)]), f"at most {MAX_PARTS}"),
        (body(part("amount", b"1"), part("params", b'{"amount": 2}')), "both as a field"),
        (body(part("params", b"[1]")), "must be a JSON object"),
        (body(part("req_id", b"a"), part("req_id", b"b")), "given 2 times"),
        (body(part("name", b"\xff\xfe")), "not UTF-8"),
    ],
)
def test_hostile_or_broken_bodies_are_422s_that_say_why(raw: bytes, message: str) -> None:
    """Unclosed bodies, nameless parts, giant heads, part floods: clear refusals."""
    with pytest.raises(ApiError) as info:
        form_envelope(parse_form(raw, CT))
    assert message in info.value.message


def test_a_content_type_without_a_usable_boundary_is_refused() -> None:
    """No boundary, or one over 70 characters, is a 422."""
    for ctype in ("multipart/form-data", "multipart/form-data; boundary=" + "b" * 71):
        with pytest.raises(ApiError, match="boundary"):
            parse_form(b"", ctype)


def test_envelope_fields_are_refused_outside_a_job_submit() -> None:
    """webhook on the sync path is not a field it knows."""
    with pytest.raises(ApiError, match="job submit only"):
        parse_form_envelope(body(part("webhook", b"https://x")), CT)


def test_a_flood_of_tiny_parts_is_refused_at_the_first_part_too_many() -> None:
    """Issue 37.2: a 16 MiB body of ~1.4 million empty parts is refused once part
    MAX_PARTS + 1 shows, without splitting the body (the old ``split`` made a bytes
    object per part first: +200 MiB). The scan allocates next to nothing: under
    1 MiB at its peak (tracemalloc), whatever the body's size."""
    import tracemalloc

    tiny = b"--XyZ\r\n\r\n\r\n"
    raw = tiny * ((16 << 20) // len(tiny)) + b"--XyZ--\r\n"
    tracemalloc.start()
    try:
        with pytest.raises(ApiError, match=f"at most {MAX_PARTS} parts"):
            parse_form(raw, CT)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_a_part_copies_its_content_once_and_a_large_file_costs_its_size() -> None:
    """A 16 MiB file part: the parse allocates about the content once (+ a little),
    not the three copies of split, strip and partition."""
    import tracemalloc

    data = b"\x00\x01" * (8 << 20)
    raw = body(part("image", data, "a.bin", "application/octet-stream"))
    tracemalloc.start()
    try:
        form = parse_form(raw, CT)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert form.files["image"][0].data == data
    assert peak < len(data) + (1 << 20), peak


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (body(part("n" * 201, b"x")), "a name over 200 characters"),
        (b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n" + b"X-Pad: " + b"p" * 9000
         + b"\r\n\r\nv\r\n--XyZ--\r\n", "headers over 8192 bytes"),
        (b"--XyZ" * (MAX_PARTS + 5), f"at most {MAX_PARTS} parts"),
        (b"no delimiter at all", "closing boundary"),
        (body(part("a", b"1"))[:-9], "closing boundary"),
    ],
)  # fmt: skip
def test_names_heads_counts_and_framing_are_bounded(raw: bytes, message: str) -> None:
    with pytest.raises(ApiError, match=message):
        parse_form(raw, CT)
