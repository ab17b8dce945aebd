"""The OpenAI images mapping, pure (issue 35 item 2): what each field becomes and
what is refused, naming OpenAI's param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mortred_twisted.http.protocols.openai_images import (
    OpenAIError,
    images_answer,
    param_of,
    parse_generations,
)


def test_fields_map_onto_the_models_inputs() -> None:
    ask = parse_generations(
        {"model": "M", "prompt": "p", "n": 3, "size": "64x32", "response_format": "url",
         "user": "u-1", "seed": 5, "guidance_scale": 2.5},
        "M",
    )  # fmt: skip
    assert ask.params == {
        "prompt": "p", "num_images": 3, "width": 64, "height": 32, "seed": 5,
        "guidance_scale": 2.5,
    }  # fmt: skip
    assert ask.response_format == "url"
    default = parse_generations({"prompt": "p"}, "M")  # model defaults to the port's
    assert default.params == {"prompt": "p", "num_images": 1}
    assert default.response_format == "b64_json"
    assert parse_generations({"prompt": "p", "size": "auto"}, "M").params.get("width") is None


@pytest.mark.parametrize(
    ("doc", "status", "param"),
    [
        ([1], 400, None),
        ({"prompt": "p", "model": 5}, 400, "model"),
        ({"prompt": "p", "model": "OTHER"}, 404, "model"),
        ({}, 400, "prompt"),
        ({"prompt": "   "}, 400, "prompt"),
        ({"prompt": "x" * 32_001}, 400, "prompt"),
        ({"prompt": "p", "n": "2"}, 400, "n"),
        ({"prompt": "p", "n": True}, 400, "n"),
        ({"prompt": "p", "n": -1}, 400, "n"),
        ({"prompt": "p", "size": "123456x2"}, 400, "size"),
        ({"prompt": "p", "size": "0x32"}, 400, "size"),
        ({"prompt": "p", "size": "32X32"}, 400, "size"),
        ({"prompt": "p", "size": " 32x32"}, 400, "size"),
        ({"prompt": "p", "size": 32}, 400, "size"),
        ({"prompt": "p", "response_format": "png"}, 400, "response_format"),
        ({"prompt": "p", "user": "u" * 257}, 400, "user"),
        ({"prompt": "p", "user": 7}, 400, "user"),
        ({"prompt": "p", "style": "vivid"}, 400, "style"),
        ({"prompt": "p", "stream": True}, 400, "stream"),
        ({"prompt": "p", "width": 32}, 400, "width"),
    ],
)
def test_refusals_name_the_param(doc: Any, status: int, param: str | None) -> None:
    with pytest.raises(OpenAIError) as caught:
        parse_generations(doc, "M")
    err = caught.value
    assert (err.status, err.param) == (status, param)
    assert err.body()["error"]["param"] == param and err.body()["error"]["message"]


def test_validation_fields_become_openai_params() -> None:
    assert param_of("params.num_images") == "n"
    assert param_of("params.width") == "size" and param_of("params.height") == "size"
    assert param_of("params.seed") == "seed" and param_of("params.prompt") == "prompt"


def test_the_answer_shape() -> None:
    data = {"images": [{"base64": "QUJD", "url": None}, {"base64": "REVG"}]}
    assert images_answer(data, "b64_json", "")["data"] == [{"b64_json": "QUJD"},
                                                           {"b64_json": "REVG"}]  # fmt: skip
    files = {"images": [{"url": "/jobs/job_1/files/a.png"}]}
    answer = images_answer(files, "url", "http://h:1")
    assert answer["data"] == [{"url": "http://h:1/jobs/job_1/files/a.png"}]
    assert isinstance(answer["created"], int)
    inline = {"images": [{"base64": "QUJD", "content_type": "image/png"}]}
    assert images_answer(inline, "url", "")["data"] == [{"url": "data:image/png;base64,QUJD"}]


def test_the_gateway_routes_the_door_by_path() -> None:
    """``/v1/models/<id>/openai/v1/{images/generations,models}`` reach the model's door;
    any other path under ``openai/`` is 404 (no match), other methods 405."""
    from mortred_twisted.config.catalog import Catalog, CatalogEntry
    from mortred_twisted.gateway.routing import (
        RouteError,
        RouteKind,
        check_method,
        match,
        resolve,
    )

    catalog = Catalog([CatalogEntry("M", "fake", "127.0.0.1", 1, "/i", True, 16, "m.toml")])
    images = match("/v1/models/M/openai/v1/images/generations", catalog)
    assert images is not None and images.kind is RouteKind.OPENAI_IMAGES
    assert resolve(check_method(images, "POST"), catalog).upstream_path == (
        "/v1/images/generations"
    )
    models = match("/v1/models/M/openai/v1/models", catalog)
    assert models is not None
    assert resolve(check_method(models, "GET"), catalog).upstream_path == "/v1/models"
    edits = match("/v1/models/M/openai/v1/images/edits", catalog)
    assert edits is not None and edits.kind is RouteKind.OPENAI_EDITS
    for path in ("/v1/models/M/openai/v1/images/variations", "/v1/models/M/openai/v2/models",
                 "/v1/models/M/openai", "/v1/models/M/openai/v1/images/generations/x"):  # fmt: skip
        assert match(path, catalog) is None, path
    with pytest.raises(RouteError) as caught:
        check_method(images, "GET")
    assert caught.value.status == 405


def test_public_urls_and_hosts() -> None:
    from mortred_twisted.http.protocols.openai_images import public_base, public_image_urls

    assert public_base(b"gw.example:8080") == "http://gw.example:8080"
    assert public_base(b"[::1]:9") == "http://[::1]:9"
    for host in (None, b"", b"evil.com/path", b"a b", b"x\r\nSet-Cookie: y", b"h:123456"):
        assert public_base(host) == ""
    body = json.dumps(
        {"created": 1, "data": [{"url": "http://127.0.0.1:5/jobs/job_1/files/a.png"},
                                {"url": "data:image/png;base64,QQ=="},
                                {"url": "https://elsewhere/x.png"}, {"b64_json": "QQ=="}]}
    ).encode()  # fmt: skip
    out = json.loads(public_image_urls(body, "/v1/models/M/jobs/", "http://gw"))
    assert [d.get("url") for d in out["data"]] == [
        "http://gw/v1/models/M/jobs/job_1/files/a.png", "data:image/png;base64,QQ==",
        "https://elsewhere/x.png", None,
    ]  # fmt: skip
    for raw in (b"not json", b"[1]", b'{"data": 5}', b'{"data": [1, null]}', b"\xff"):
        assert public_image_urls(raw, "/p/", "http://gw") == raw


def test_edits_forms_map_and_refuse() -> None:
    from mortred_twisted.http.protocols.openai_images import parse_edits
    from mortred_twisted.sdk.validation import Upload

    pic, mask = Upload(b"p", "image/png", "a.png"), Upload(b"m", "image/png", "m.png")
    ask, text = parse_edits(
        {"prompt": ["p"], "n": ["2"], "size": ["32x32"], "strength": ["0.5"]},
        {"image": [pic], "mask": [mask]}, "M",
    )  # fmt: skip
    assert text and ask.params == {
        "prompt": "p", "num_images": 2, "width": 32, "height": 32, "image": pic, "mask": mask,
        "strength": "0.5",
    }  # fmt: skip
    assert parse_edits({"prompt": ["p"]}, {"image[]": [pic]}, "M")[0].params["image"] is pic
    cases = [
        ({"prompt": ["p"]}, {}, "image"),
        ({"prompt": ["p"]}, {"image": [pic, pic]}, "image"),
        ({"prompt": ["p"]}, {"image": [pic], "mask": [mask, mask]}, "mask"),
        ({"prompt": ["p"], "n": ["x"]}, {"image": [pic]}, "n"),
        ({"prompt": ["p"], "n": ["1", "2"]}, {"image": [pic]}, "n"),
        ({"prompt": ["p"], "style": ["v"]}, {"image": [pic]}, "style"),
        ({"prompt": ["p"], "width": ["8"]}, {"image": [pic]}, "width"),
        ({"prompt": ["p"]}, {"image": [pic], "other": [pic]}, "other"),
        ({}, {"image": [pic]}, "prompt"),
    ]
    for fields, files, param in cases:
        with pytest.raises(OpenAIError) as caught:
            parse_edits(fields, files, "M")
        assert caught.value.param == param, (fields, files)
