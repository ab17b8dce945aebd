"""Per-model input limits, tried as an attacker would: too many images, a 4096² PNG
header on SAM_AMG, a decompression bomb, a truncated header. Every one is refused
from the headers at validation, before a pixel is decoded, on /infer and /jobs."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import pickle
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageFile
from twisted.internet.task import Clock

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.errors import ENTITY_TOO_LARGE, to_api_error
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import (
    InferenceRequest,
    InputDecodeError,
    InputTooLarge,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.model_api.input_limits import (
    DEFAULT_INPUT_LIMITS,
    GENERIC_INPUT_LIMITS,
    InputLimits,
    split_input_limits,
)
from mortred_twisted.models import codec
from mortred_twisted.models.isolated import validation_twin
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.support.memory_http import MemoryClient

SAM = DEFAULT_INPUT_LIMITS["SAM_AMG"]


def png_header(width: int, height: int, *, idat: bytes = b"\x00" * 8) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (RGB, 8 bit) and whose IDAT is
    a few bytes: tiny on the wire, whatever it claims."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def real_png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every pixel decode in this test: Pillow's ``ImageFile.load`` (all formats
    decompress through it) and ``codec.decode_image``, recorded."""
    calls: list[str] = []
    real_load, real_decode = ImageFile.ImageFile.load, codec.decode_image

    def load(self: Any) -> Any:
        calls.append(f"load {self.format} {self.size}")
        return real_load(self)

    def decode_image(data: bytes, **kw: Any) -> Any:
        calls.append("decode_image")
        return real_decode(data, **kw)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    monkeypatch.setattr(codec, "decode_image", decode_image)
    yield calls


class Decoding(Model):
    """A model that decodes its images in ``run``, as SAM_AMG does."""

    def run(self, request: InferenceRequest, ctx: RunContext) -> Any:
        return [codec.decode_image(img).shape for img in request.images]


def sam_like() -> Decoding:
    model = Decoding()
    model.input_limits = SAM
    return model


def request(*images: bytes) -> InferenceRequest:
    return InferenceRequest(req_id="r", images=images)


# -- the abuse cases, at validation ---------------------------------------------------


def test_sixty_four_images_are_refused_before_any_header_is_read(decodes: list[str]) -> None:
    """64 images on SAM_AMG: 413-class refusal naming max_images and its value, and
    not one image looked at."""
    with pytest.raises(InputTooLarge) as e:
        sam_like().validate(request(*[png_header(4096, 4096)] * 64))
    assert (e.value.limit, e.value.value) == ("max_images", SAM.max_images)
    assert f"max_images = {SAM.max_images}" in str(e.value) and "64 images" in str(e.value)
    assert to_api_error(e.value).http_status == 413
    assert decodes == []


def test_a_4096_square_png_header_on_sam_is_refused_undecoded(decodes: list[str]) -> None:
    """A 4096x4096 PNG (its header; a few bytes of IDAT) is over SAM_AMG's max_pixels:
    refused from the header, the message names the size, the limit and its value."""
    with pytest.raises(InputTooLarge) as e:
        sam_like().validate(request(real_png(8, 8), png_header(4096, 4096)))
    assert (e.value.field, e.value.limit) == ("images[1]", "max_pixels")
    assert "4096x4096 = 16777216 pixels" in str(e.value)
    assert f"max_pixels = {SAM.max_pixels}" in str(e.value)
    assert decodes == []


@pytest.mark.parametrize("size", [(100_000, 100_000), (20_000, 5_000), (2_000_000, 1)])
def test_a_decompression_bomb_is_refused_from_its_header(
    size: tuple[int, int], decodes: list[str]
) -> None:
    """A tiny PNG declaring huge dimensions (over Pillow's own bomb guard, between its
    warning and its error, or a thin strip) is refused by max_pixels, undecoded."""
    bomb = png_header(*size, idat=zlib.compress(b"\x00" * 1000))
    assert len(bomb) < 200
    warns = size == (20_000, 5_000)
    warned = pytest.warns(Image.DecompressionBombWarning) if warns else contextlib.nullcontext()
    with warned, pytest.raises(InputTooLarge) as e:
        sam_like().validate(request(bomb))
    assert e.value.limit == "max_pixels" and to_api_error(e.value).http_status == 413
    assert decodes == []


@pytest.mark.parametrize(
    "data",
    [
        png_header(64, 64)[:20],  # cut inside IHDR
        b"\x89PNG\r\n\x1a\n",  # the signature alone
        b"",
        b"not a picture",
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n",  # a format we never open
    ],
)
def test_an_unreadable_header_is_refused_undecoded(data: bytes, decodes: list[str]) -> None:
    """A truncated or foreign header is an undecodable input (400), found at
    validation, naming the image."""
    with pytest.raises(InputDecodeError) as e:
        sam_like().validate(request(real_png(4, 4), data))
    assert "images[1]" in str(e.value)
    assert to_api_error(e.value).http_status == 400
    assert decodes == []


def test_within_the_limits_the_request_passes_and_decodes_in_run(decodes: list[str]) -> None:
    """Four 1024x1024 pictures pass SAM_AMG's limits; only run() decodes them."""
    model = sam_like()
    valid = model.validate(request(*[real_png(1024, 1024)] * 4))
    assert decodes == []
    assert model.run(valid, RunContext()) == [(1024, 1024, 3)] * 4
    assert decodes.count("decode_image") == 4
    assert decodes.count("load PNG (1024, 1024)") >= 4  # the spy sees real decodes


def test_the_decoder_backstop_refuses_what_no_limit_admits() -> None:
    """decode_image itself refuses a header over MAX_PIXELS, and a bomb, unread."""
    with pytest.raises(InputDecodeError, match="too large"):
        codec.decode_image(png_header(4097, 4096))
    with pytest.raises(InputDecodeError, match="too large"):
        codec.decode_image(png_header(100_000, 100_000))


# -- configuration --------------------------------------------------------------------


def test_limits_come_from_the_model_config_and_the_family_never_sees_them() -> None:
    """max_images/max_pixels override the type's default and are taken out of the
    options; unset, each type gets its default (SAM_AMG's, else the generic one)."""
    limits, rest = split_input_limits("SAM_AMG", {"max_pixels": 4096, "device": "cpu"})
    assert limits == InputLimits(max_images=SAM.max_images, max_pixels=4096)
    assert rest == {"device": "cpu"}
    assert split_input_limits("YOLOV8", {})[0] == GENERIC_INPUT_LIMITS
    assert split_input_limits("fake", {})[0] == InputLimits(None, None)
    model = create_model("fake", {"max_images": 2, "fake_delay_ms": 0}, Path("."))
    assert model.input_limits == InputLimits(max_images=2, max_pixels=None)


def test_bad_limits_are_config_errors_listed_with_the_others() -> None:
    """A limit that is not an integer from 1 to its ceiling stops the server at load."""
    doc = {"server": {"id": "T"}, "model": {"type": "fake", "max_images": 65, "max_pixels": "x"}}
    with pytest.raises(ConfigErrors) as e:
        build_server_config(doc, env={})
    text = str(e.value)
    assert "model.max_images: must be between 1 and 64 (got 65)" in text
    assert "model.max_pixels: expected an integer" in text
    with pytest.raises(ModelLoadError, match="max_pixels"):
        create_model("fake", {"max_pixels": 0}, Path("."))


def test_a_process_workers_validation_twin_keeps_the_limits(decodes: list[str]) -> None:
    """With worker_isolation = "process" the server validates with the twin a worker
    sends back: it carries the limits (pickled) and refuses the same requests."""
    twin = pickle.loads(pickle.dumps(validation_twin(sam_like())))
    assert twin.input_limits == SAM
    with pytest.raises(InputTooLarge, match="max_pixels"):
        twin.validate(request(png_header(4096, 4096)))
    assert decodes == []


# -- over HTTP: /infer and /jobs ------------------------------------------------------


def serve(**model: Any) -> tuple[ModelRuntime, HandThreads, MemoryClient]:
    """A model server app whose model is built by the registry from ``[model]``."""
    doc = {
        "server": {"id": "T", "server_uri": "/infer", "async_enabled": True},
        "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1, **model},
    }
    config = build_server_config(doc, env={})
    threads, clock = HandThreads(), Clock()
    runtime = ModelRuntime(
        config, clock=clock, threads=threads, metrics=ServerMetrics(), build_model=create_model
    )
    runtime.load_models()
    threads.step()
    return runtime, threads, MemoryClient(ModelPortFactory.for_app(ModelServerApp(runtime), clock))


def post(stub: MemoryClient, url: str, images: Sequence[bytes]) -> tuple[int, dict[str, Any]]:
    body = {"images": [base64.b64encode(i).decode() for i in images]}
    d = stub.request("POST", "http://localhost" + url, data=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})  # fmt: skip
    stub.flush()
    out: list[Any] = []
    d.addCallback(lambda r: r.content().addCallback(lambda b: out.append((r.code, b))))
    stub.flush()
    code, raw = out[0]
    return code, json.loads(raw)


@pytest.mark.parametrize("url", ["/infer", "/jobs"])
def test_over_http_both_paths_answer_413_or_400_before_the_model_runs(
    url: str, decodes: list[str]
) -> None:
    """/infer and POST /jobs refuse too many images and too many pixels with 413
    (code 61, the limit named) and a truncated header with 400 (code 3): no job is
    admitted, the model never runs, nothing is decoded."""
    runtime, threads, stub = serve(max_images=2, max_pixels=64 * 64)
    cases = [
        ([real_png(8, 8)] * 3, 413, "max_images = 2"),
        ([png_header(4096, 4096)], 413, "max_pixels = 4096"),
        ([png_header(100_000, 100_000)], 413, "max_pixels = 4096"),
        ([png_header(64, 64)[:20]], 400, "images[0]"),
    ]
    for images, status, needle in cases:
        code, doc = post(stub, url, images)
        message = doc.get("msg") or doc.get("error")
        assert (code, doc["code"]) == (status, ENTITY_TOO_LARGE if status == 413 else 3), doc
        assert needle in message, message
    assert threads.pending == 0 and decodes == []
    assert runtime.ledger.nonterminal_ids() == []  # no job admitted
    # Within the limits: admitted (a job, or a sync run handed to the worker pool).
    body = {"images": [base64.b64encode(real_png(64, 64)).decode()] * 2}
    stub.request("POST", "http://localhost" + url, data=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    stub.flush()
    assert threads.pending == 1 or len(runtime.ledger.nonterminal_ids()) == 1
