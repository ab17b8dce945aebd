"""Replicate's predictions API (issue 35 item 4) with the real ``replicate`` client
against TXT2IMG on a real model port: ``run()``, ``predictions.create`` + ``wait()``,
``cancel()``, file outputs that download, the model and version routes, and errors
in Replicate's shape."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

replicate = pytest.importorskip("replicate")
from PIL import Image  # noqa: E402

from tests.support.servers import RunningServer, model_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "server" / "diffusion" / "txt2img.toml"
TOKEN = "replicate-door-token"
REF = "mortred/TXT2IMG"
FAST = {"prompt": "a red dot", "sample_steps": 2, "seed": 9}

pytestmark = pytest.mark.skipif(
    not (ROOT / "weights" / "txt2img" / "model_index.json").is_file(),
    reason="weights/txt2img is not trained yet (training/txt2img/train_pipeline.py)",
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with model_server(CONF, env={"MORTRED_AUTH_TOKEN": TOKEN}) as srv:
        yield srv


@pytest.fixture
def client(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> replicate.Client:
    monkeypatch.setenv("REPLICATE_POLL_INTERVAL", "0.05")
    return replicate.Client(api_token=TOKEN, base_url=server.base_url)


def download(url: str) -> Image.Image:
    got = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert got.status_code == 200, got.text
    return Image.open(io.BytesIO(got.content))


def test_run_answers_the_output_with_file_urls(client: replicate.Client) -> None:
    output = client.run(REF, input={**FAST, "num_images": 2})
    assert output["seed"] == 9 and len(output["images"]) == 2
    for url in output["images"]:
        assert download(url).size == (32, 32)


def test_create_then_wait_and_the_prediction_object(client: replicate.Client) -> None:
    prediction = client.models.predictions.create(model=REF, input=FAST)
    assert prediction.status in ("starting", "processing")
    assert prediction.model == REF and prediction.version == "TXT2IMG"
    assert prediction.urls["get"].endswith(f"/v1/predictions/{prediction.id}")
    prediction.wait()
    assert prediction.status == "succeeded", prediction.error
    assert prediction.metrics["predict_time"] >= 0
    assert download(prediction.output["images"][0]).size == (32, 32)
    again = client.predictions.get(prediction.id)
    assert again.status == "succeeded" and again.output == prediction.output
    by_version = client.predictions.create(version="TXT2IMG", input=FAST)
    by_version.wait()
    assert by_version.status == "succeeded"


def test_cancel(client: replicate.Client) -> None:
    long = client.models.predictions.create(model=REF, input={**FAST, "sample_steps": 1000})
    long.cancel()
    long.wait()
    assert long.status == "canceled"


def test_model_and_version(client: replicate.Client) -> None:
    model = client.models.get(REF)
    assert (model.owner, model.name, model.latest_version.id) == ("mortred", "TXT2IMG", "TXT2IMG")
    assert model.versions.get("TXT2IMG").id == "TXT2IMG"


def test_errors(client: replicate.Client, server: RunningServer) -> None:
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        client.models.predictions.create(model=REF, input={"prompt": "x", "sample_steps": 0})
    assert caught.value.status == 422 and "sample_steps" in caught.value.detail
    with pytest.raises(replicate.exceptions.ReplicateError) as missing:
        client.models.predictions.create(model="someone/else", input=FAST)
    assert missing.value.status == 404
    with pytest.raises(replicate.exceptions.ReplicateError) as unknown:
        client.predictions.get("job_0123456789abcdef01234567")
    assert unknown.value.status == 404
    stranger = replicate.Client(api_token="wrong", base_url=server.base_url)
    with pytest.raises(replicate.exceptions.ReplicateError) as denied:
        stranger.models.predictions.create(model=REF, input=FAST)
    assert denied.value.status == 401
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for body, status in ((b"[1]", 422), (b'{"input": 5}', 422), (b'{"stream": true}', 422),
                         (b'{"version": "other"}', 422), (b'{"nope": 1}', 422),
                         (b'{"webhook": "http://evil.example/x"}', 422), (b"{x", 400)):  # fmt: skip
        got, _h, raw = server.request("POST", "/v1/predictions", body, auth)
        assert got == status and json.loads(raw)["detail"], (body, raw)
    got, _h, raw = server.request(
        "POST", "/v1/predictions", json.dumps({"input": FAST}).encode(),
        {**auth, "Prefer": "wait=abc"},
    )  # fmt: skip
    assert got == 400


def test_refusals_from_the_head_keep_replicates_shape(server: RunningServer) -> None:
    """A body refused before it is read (401 here) still answers {title, detail, status}."""
    status, _h, raw = server.request(
        "POST", "/v1/predictions", b'{"input": {}}', {"Content-Type": "application/json"}
    )
    doc = json.loads(raw)
    assert status == 401 and doc["status"] == 401 and "bearer" in doc["detail"]
