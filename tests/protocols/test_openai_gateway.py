"""The OpenAI images door through the gateway (issue 35 item 2) with the real
``openai`` package and gateway API keys: ``base_url = <gateway>/v1/models/<id>/openai/v1``,
``api_key`` = the caller's key. Pictures in both formats (the url one is the
gateway's public file route, and another key cannot read it), OpenAI's error object
for the gateway's own refusals, and each key's idempotency scope."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
from PIL import Image  # noqa: E402

from mortred_twisted.gateway.apikeys import hash_key  # noqa: E402
from tests.control.plane import ControlPlane, control_plane  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "TXT2IMG"
FAST = {"sample_steps": 2, "seed": 3}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (ROOT / "weights" / "txt2img" / "model_index.json").is_file(),
        reason="weights/txt2img is not trained yet (training/txt2img/train_pipeline.py)",
    ),
]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp = tmp_path_factory.mktemp("openai-gw")
    (tmp / "api_keys.toml").write_text(
        "".join(
            f'[[keys]]\nname = "{k}"\nsha256 = "{hash_key(k + "-key")}"\nscope = "inference"\n'
            for k in ("alice", "bob")
        )
    )
    with control_plane(tmp, [MODEL]) as cp:
        cp.wait_ready(["gateway", MODEL], timeout=180)
        yield cp


def client(plane: ControlPlane, key: str) -> openai.OpenAI:
    base = f"http://127.0.0.1:{plane.gw_port}/v1/models/{MODEL}/openai/v1"
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0)


def test_generate_both_formats_through_the_gateway(plane: ControlPlane) -> None:
    alice = client(plane, "alice-key")
    assert [m.id for m in alice.models.list()] == [MODEL]
    answer = alice.images.generate(
        model=MODEL, prompt="a red dot", n=2, size="32x32", response_format="b64_json",
        extra_body=FAST,
    )  # fmt: skip
    for item in answer.data:
        assert Image.open(io.BytesIO(base64.b64decode(item.b64_json))).size == (32, 32)
    answer = alice.images.generate(
        model=MODEL, prompt="a red dot", size="32x64", response_format="url", extra_body=FAST
    )
    url = answer.data[0].url
    public = f"http://127.0.0.1:{plane.gw_port}/v1/models/{MODEL}/jobs/job_"
    assert url.startswith(public), url
    own = urllib.request.Request(url, headers={"Authorization": "Bearer alice-key"})
    with urllib.request.urlopen(own, timeout=60) as got:
        assert Image.open(io.BytesIO(got.read())).size == (32, 64)
    other = urllib.request.Request(url, headers={"Authorization": "Bearer bob-key"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(other, timeout=60)
    assert caught.value.code == 404  # another key's job: as unknown


def test_refusals_use_openais_error_object(plane: ControlPlane) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        client(plane, "nobody").images.generate(model=MODEL, prompt="x")
    assert denied.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client(plane, "alice-key").images.generate(model=MODEL, prompt="x", size="7x7")
    assert caught.value.body["param"] == "size"
    unknown = openai.OpenAI(
        base_url=f"http://127.0.0.1:{plane.gw_port}/v1/models/NOPE/openai/v1",
        api_key="alice-key", max_retries=0,
    )  # fmt: skip
    with pytest.raises(openai.NotFoundError) as missing:
        unknown.images.generate(model="NOPE", prompt="x")
    assert missing.value.body["message"].startswith("unknown model")


def test_respond_async_and_idempotency_are_per_key(plane: ControlPlane) -> None:
    body = {"model": MODEL, "prompt": "a line", "size": "32x32", **FAST}
    path = f"/v1/models/{MODEL}/openai/v1/images/generations"
    hdrs = {"Prefer": "respond-async", "Idempotency-Key": "same-key"}
    jobs = {}
    for who in ("alice", "bob", "alice"):
        code, headers, raw, _ = plane.gw("POST", path, body=body, headers=hdrs, token=f"{who}-key")
        assert code == 202, raw
        doc = json.loads(raw)
        assert doc["poll_url"].startswith(f"/v1/models/{MODEL}/jobs/")
        assert headers["location"] == doc["poll_url"]
        jobs.setdefault(who, set()).add(doc["job_id"])
    assert len(jobs["alice"]) == 1 and jobs["alice"] != jobs["bob"]  # replayed per key


def test_the_oip_door_through_the_gateway(plane: ControlPlane) -> None:
    """tritonclient with the gateway's per-model base path and an API key: metadata,
    ready and a binary-mode infer reach TXT2IMG; no key is a 401 (health included:
    through the gateway every route takes the key)."""
    httpclient = pytest.importorskip("tritonclient.http")
    import numpy as np

    url = f"127.0.0.1:{plane.gw_port}/v1/models/{MODEL}/oip"
    client = httpclient.InferenceServerClient(url=url)
    assert not client.is_server_live()  # the gateway takes the key on every route
    assert client.is_server_live(headers={"Authorization": "Bearer alice-key"})
    assert client.is_model_ready(MODEL, headers={"Authorization": "Bearer alice-key"})
    meta = client.get_model_metadata(MODEL, headers={"Authorization": "Bearer alice-key"})
    assert {i["name"] for i in meta["inputs"]} >= {"prompt", "num_images", "seed"}
    inputs = []
    for name, value, datatype in (
        ("prompt", np.array([b"a dot"], dtype=np.object_), "BYTES"),
        ("sample_steps", np.array([2], dtype=np.int64), "INT64"),
    ):
        t = httpclient.InferInput(name, [1], datatype)
        t.set_data_from_numpy(value, binary_data=True)
        inputs.append(t)
    wanted = [httpclient.InferRequestedOutput("images", binary_data=True)]
    result = client.infer(
        MODEL, inputs, outputs=wanted, headers={"Authorization": "Bearer alice-key"}
    )
    (picture,) = result.as_numpy("images")
    assert Image.open(io.BytesIO(picture)).size == (32, 32)
    with pytest.raises(Exception, match="unauthorized"):
        client.get_model_metadata(MODEL)


def test_the_replicate_door_through_the_gateway(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replicate client with base_url <gateway>/v1/models/<id>/replicate and an API
    key: run() answers file URLs at the gateway's file route (downloadable with the
    key), a prediction's urls are the gateway's, and another key's prediction is 404."""
    replicate = pytest.importorskip("replicate")
    import httpx

    monkeypatch.setenv("REPLICATE_POLL_INTERVAL", "0.05")
    base = f"http://127.0.0.1:{plane.gw_port}/v1/models/{MODEL}/replicate"
    alice = replicate.Client(api_token="alice-key", base_url=base)
    output = alice.run(f"mortred/{MODEL}", input={"prompt": "a dot", **FAST})
    (url,) = output["images"]
    assert url.startswith(f"http://127.0.0.1:{plane.gw_port}/v1/models/{MODEL}/jobs/job_")
    got = httpx.get(url, headers={"Authorization": "Bearer alice-key"}, timeout=60)
    assert Image.open(io.BytesIO(got.content)).size == (32, 32)
    prediction = alice.models.predictions.create(model=f"mortred/{MODEL}", input={
        "prompt": "a dot", **FAST})  # fmt: skip
    assert prediction.urls["get"] == f"{base}/v1/predictions/{prediction.id}"
    prediction.wait()
    assert prediction.status == "succeeded"
    bob = replicate.Client(api_token="bob-key", base_url=base)
    with pytest.raises(replicate.exceptions.ReplicateError) as caught:
        bob.predictions.get(prediction.id)
    assert caught.value.status == 404


def test_edits_pass_the_gateway_as_multipart(plane: ControlPlane) -> None:
    """images.edit goes through the gateway (multipart) to the model, whose declaration
    refuses a picture on a text-to-image model: 400 naming ``image``."""
    out = io.BytesIO()
    Image.new("RGB", (32, 32)).save(out, format="PNG")
    with pytest.raises(openai.BadRequestError) as caught:
        client(plane, "alice-key").images.edit(
            model=MODEL, image=("a.png", out.getvalue(), "image/png"), prompt="x"
        )
    assert caught.value.body["param"] == "image", caught.value.body
