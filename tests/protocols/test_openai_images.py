"""The OpenAI images door (issue 35 item 2) with the real ``openai`` package against
TXT2IMG (the text-to-image pipeline trained here) on a real model port: models.list,
images.generate in both response formats (decodable PNGs of the asked size and
count), OpenAI's errors naming the param, ``Prefer: respond-async``, and a client
that leaves cancelling its job."""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
from PIL import Image  # noqa: E402

from tests.support.servers import RunningServer, model_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "server" / "diffusion" / "txt2img.toml"
TOKEN = "openai-door-token"
FAST = {"sample_steps": 2, "seed": 7}

pytestmark = pytest.mark.skipif(
    not (ROOT / "weights" / "txt2img" / "model_index.json").is_file(),
    reason="weights/txt2img is not trained yet (training/txt2img/train_pipeline.py)",
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    env = {"MORTRED_AUTH_TOKEN": TOKEN}
    with model_server(CONF, env=env) as srv:
        yield srv


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=TOKEN, max_retries=0)


def picture(raw: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(raw))
    assert image.format == "PNG"
    image.load()
    return image


def test_models_list_names_the_catalog_id(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["TXT2IMG"]


def test_generate_b64_json_gives_n_pngs_of_the_size(client: openai.OpenAI) -> None:
    answer = client.images.generate(
        model="TXT2IMG", prompt="a red circle", n=2, size="32x32",
        response_format="b64_json", extra_body=FAST,
    )  # fmt: skip
    assert answer.created > 0 and len(answer.data) == 2
    for item in answer.data:
        assert picture(base64.b64decode(item.b64_json)).size == (32, 32)


def test_generate_url_points_at_the_jobs_result_file(
    client: openai.OpenAI, server: RunningServer
) -> None:
    answer = client.images.generate(
        model="TXT2IMG", prompt="a blue square", n=1, size="64x32", response_format="url",
        extra_body=FAST,
    )  # fmt: skip
    (item,) = answer.data
    assert item.url.startswith(server.base_url + "/jobs/job_")
    fetch = urllib.request.Request(item.url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(fetch, timeout=60) as got:
        assert picture(got.read()).size == (64, 32)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"size": "big"}, "size"),
        ({"size": "33x32"}, "size"),  # not a multiple the UNet takes (the declaration's)
        ({"size": "4096x4096"}, "size"),
        ({"n": 100000}, "n"),
        ({"n": 0}, "n"),
        ({"quality": "hd"}, "quality"),
        ({"response_format": "gif"}, "response_format"),
        ({"seed": -1}, "seed"),  # a model input: the declaration's bound
        ({"num_images": 2}, "num_images"),  # given as n
    ],
)
def test_bad_input_is_a_400_naming_the_param(
    client: openai.OpenAI, fields: dict, param: str
) -> None:
    given = {"size": "32x32", **fields}
    core = {k: given.pop(k) for k in ("size", "n", "quality", "response_format") if k in given}
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.generate(model="TXT2IMG", prompt="x", **core, extra_body=given)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == param, body


def test_unknown_model_bad_key_and_bad_json(client: openai.OpenAI, server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="DALL-E-9", prompt="x")
    stranger = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.images.generate(model="TXT2IMG", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for raw in (b"{not json", b"[1, 2]", b'{"prompt": 5}', b'{"prompt": ""}'):
        status, _h, body = server.request("POST", "/v1/images/generations", raw, auth)
        assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, _h, body = server.request(
        "POST", "/v1/images/generations", b"prompt=x",
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"},
    )  # fmt: skip
    assert status == 415 and "error" in json.loads(body)


def test_prefer_respond_async_gives_the_202_job(
    client: openai.OpenAI, server: RunningServer
) -> None:
    raw = client.images.with_raw_response.generate(
        model="TXT2IMG", prompt="a green line", size="32x32", extra_body=FAST,
        extra_headers={"Prefer": "respond-async"},
    )  # fmt: skip
    assert raw.status_code == 202
    assert raw.headers["preference-applied"] == "respond-async"
    job = json.loads(raw.http_response.content)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, done = server.json("GET", f"/jobs/{job['job_id']}/wait?timeout=120000", headers=auth)
    assert status == 200 and done["state"] == "done"


def test_a_client_that_leaves_cancels_its_job(server: RunningServer) -> None:
    """The held request's connection closes while the job runs: the job ends
    cancelled (the same key with respond-async finds the job: a replay)."""
    body = json.dumps(
        {"model": "TXT2IMG", "prompt": "a long one", "size": "32x32", "sample_steps": 1000}
    ).encode()
    head = (
        "POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: leave-1\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head + body)
        replay = {**auth, "Idempotency-Key": "leave-1", "Prefer": "respond-async"}
        status, headers, raw = server.request("POST", "/v1/images/generations", body, replay)
        assert status == 202 and headers["idempotent-replayed"] == "true", raw
        job_id = json.loads(raw)["job_id"]
        deadline = time.monotonic() + 120
        state = "pending"
        while state != "running" and time.monotonic() < deadline:  # an event to wait for
            state = server.json("GET", f"/jobs/{job_id}", headers=auth)[1]["state"]
        assert state == "running"
    # the socket is closed: the server cancels the job
    status, done = server.json("GET", f"/jobs/{job_id}/wait?timeout=120000", headers=auth)
    assert status == 200 and done["state"] == "cancelled", done


@pytest.fixture(scope="module")
def img2img(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The TXT2IMG weights served as image-to-image (the diffusers kind for edits)."""
    text = CONF.read_text().replace('id = "TXT2IMG"', 'id = "IMG2IMG"')
    text = text.replace('path = "weights/txt2img"', f'path = "{ROOT / "weights" / "txt2img"}"')
    text = text.replace('\ntype = "diffusers"\n', '\ntype = "diffusers"\ntask = "image-to-image"\n')
    conf = tmp_path_factory.mktemp("img2img") / "img2img.toml"
    conf.write_text(text)
    with model_server(conf, env={"MORTRED_AUTH_TOKEN": TOKEN}) as srv:
        yield srv


def png_of(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def test_edit_on_an_image_to_image_model(img2img: RunningServer) -> None:
    client = openai.OpenAI(base_url=img2img.base_url + "/v1", api_key=TOKEN, max_retries=0)
    answer = client.images.edit(
        model="IMG2IMG", image=("start.png", png_of((32, 32)), "image/png"),
        prompt="a red circle", n=2, size="32x32", response_format="b64_json",
        extra_body={"sample_steps": 4, "strength": 0.5, "seed": 1},
    )  # fmt: skip
    assert len(answer.data) == 2
    for item in answer.data:
        assert picture(base64.b64decode(item.b64_json)).size == (32, 32)
    with pytest.raises(openai.BadRequestError) as caught:  # a picture it cannot read
        client.images.edit(model="IMG2IMG", image=("x.png", b"not a png", "image/png"),
                           prompt="x")  # fmt: skip
    assert caught.value.body["param"] == "image", caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.edit(model="IMG2IMG", image=("a.png", png_of((32, 32)), "image/png"),
                           prompt="x", extra_body={"quality": "hd"})  # fmt: skip
    assert caught.value.body["param"] == "quality"


def test_edit_on_a_text_to_image_model_is_refused(client: openai.OpenAI) -> None:
    """TXT2IMG takes no picture: its declaration refuses ``image`` (400 naming it)."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.edit(model="TXT2IMG", image=("a.png", png_of((32, 32)), "image/png"),
                           prompt="x")  # fmt: skip
    assert caught.value.body["param"] == "image", caught.value.body
