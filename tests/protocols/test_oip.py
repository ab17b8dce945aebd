"""The Open Inference Protocol v2 door (issue 35 item 3) with the real
``tritonclient[http]`` on real model ports: TXT2IMG (text in, PNGs out) and an SDK
image model (a picture in, a picture out), metadata, readiness, infer in JSON and
binary modes, a plain KServe JSON body, and bodies that lie."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
from PIL import Image  # noqa: E402

from tests.support.servers import RunningServer, model_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TXT2IMG = ROOT / "conf" / "server" / "diffusion" / "txt2img.toml"
SHARPEN = ROOT / "tests" / "e2e" / "sdk_models" / "sharpen.toml"
TOKEN = "oip-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: tritonclient writes Inference-Header-Content-Length into the headers dict it is
#: given: each call gets its own copy (auth())


def auth() -> dict[str, str]:
    return dict(AUTH)


needs_weights = pytest.mark.skipif(
    not (ROOT / "weights" / "txt2img" / "model_index.json").is_file(),
    reason="weights/txt2img is not trained yet (training/txt2img/train_pipeline.py)",
)


@pytest.fixture(scope="module")
def txt2img() -> Iterator[RunningServer]:
    if not (ROOT / "weights" / "txt2img" / "model_index.json").is_file():
        pytest.skip("weights/txt2img is not trained yet")
    with model_server(TXT2IMG, env={"MORTRED_AUTH_TOKEN": TOKEN}) as srv:
        yield srv


@pytest.fixture(scope="module")
def sharpen() -> Iterator[RunningServer]:
    with model_server(SHARPEN, env={"MORTRED_AUTH_TOKEN": TOKEN}) as srv:
        yield srv


def triton(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")


def png(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def tensor(name: str, value: np.ndarray, datatype: str, binary: bool) -> object:
    t = httpclient.InferInput(name, list(value.shape), datatype)
    t.set_data_from_numpy(value, binary_data=binary)
    return t


def prompt_inputs(binary: bool, n: int = 1) -> list[object]:
    return [
        tensor("prompt", np.array([b"a red circle"], dtype=np.object_), "BYTES", binary),
        tensor("sample_steps", np.array([2], dtype=np.int64), "INT64", binary),
        tensor("seed", np.array([5], dtype=np.int64), "INT64", binary),
        tensor("num_images", np.array([n], dtype=np.int64), "INT64", binary),
    ]


@needs_weights
def test_health_and_metadata(txt2img: RunningServer) -> None:
    client = triton(txt2img)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("TXT2IMG", headers=auth())
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("TXT2IMG", headers=auth())
    inputs = {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]}
    assert inputs["prompt"] == ("BYTES", [1]) and inputs["num_images"] == ("INT64", [1])
    assert inputs["guidance_scale"] == ("FP32", [1])
    outputs = {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]}
    assert outputs["images"] == ("BYTES", [-1]) and outputs["seed"] == ("INT64", [1])
    with pytest.raises(Exception) as caught:  # tritonclient's InferenceServerException
        client.get_model_metadata("TXT2IMG")
    assert "missing bearer token" in str(caught.value)
    with pytest.raises(Exception, match="unknown model"):
        client.get_model_metadata("NOPE", headers=auth())


@needs_weights
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_text_to_image(txt2img: RunningServer, binary: bool) -> None:
    client = triton(txt2img)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("images", "seed")]
    result = client.infer(
        "TXT2IMG", prompt_inputs(binary, n=2), outputs=outputs, headers=auth(), request_id="r-1"
    )
    images = result.as_numpy("images")
    assert images.shape == (2,) and result.get_response()["id"] == "r-1"
    for item in images:
        raw = item if isinstance(item, bytes) else __import__("base64").b64decode(item)
        assert Image.open(io.BytesIO(raw)).size == (32, 32)
    assert result.as_numpy("seed").tolist() == [5]


def test_infer_an_image_model_in_both_modes(sharpen: RunningServer) -> None:
    client = triton(sharpen)
    picture = np.array([png((12, 9))], dtype=np.object_)
    result = client.infer(
        "SDK_SHARPEN", [tensor("image", picture, "BYTES", True),
                        tensor("steps", np.array([1], dtype=np.int64), "INT64", True)],
        headers=auth(),
    )  # fmt: skip
    (out,) = result.as_numpy("output")
    assert Image.open(io.BytesIO(out)).size == (12, 9)
    assert result.get_response()["outputs"][0]["datatype"] == "BYTES"
    # JSON mode: file bytes travel as base64 both ways (documented)
    import base64

    picture_b64 = base64.b64encode(png((5, 7))).decode()
    image = {"name": "image", "shape": [1], "datatype": "BYTES", "data": [picture_b64]}
    amount = {"name": "amount", "shape": [1], "datatype": "FP64", "data": [0.5]}
    body = {"inputs": [image, amount]}
    status, _h, raw = sharpen.request(
        "POST", "/v2/models/SDK_SHARPEN/infer", json.dumps(body).encode(), AUTH
    )
    assert status == 200, raw
    (tensor_out,) = json.loads(raw)["outputs"]
    decoded = base64.b64decode(tensor_out["data"][0])
    assert Image.open(io.BytesIO(decoded)).size == (5, 7)


TINY = __import__("base64").b64encode(png((2, 2))).decode()


def lying(server: RunningServer, head: dict, binary: bytes, declared: int | None = None) -> tuple:
    raw_head = json.dumps(head).encode()
    headers = {**AUTH, "Inference-Header-Content-Length": str(
        len(raw_head) if declared is None else declared)}  # fmt: skip
    status, _h, body = server.request(
        "POST", "/v2/models/SDK_SHARPEN/infer", raw_head + binary, headers
    )
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("head", "binary", "declared", "named"),
    [
        ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                      "parameters": {"binary_data_size": 10}}]}, b"\x00" * 4, None, "image"),
        ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                      "parameters": {"binary_data_size": 8}}]},
         struct.pack("<I", 1000) + b"abcd", None, "image"),
        ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                      "parameters": {"binary_data_size": 4}}]}, b"\x00" * 4, 100_000, "past"),
        ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                      "parameters": {"binary_data_size": 4}}]}, b"\x00" * 9, None, "no input"),
        ({"inputs": [{"name": "nope", "shape": [1], "datatype": "BYTES", "data": ["x"]}]},
         b"", None, "nope"),
        ({"inputs": [{"name": "steps", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
         b"", None, "steps"),
        ({"inputs": [{"name": "steps", "shape": [2], "datatype": "INT64", "data": [1]}]},
         b"", None, "steps"),
        ({"inputs": [{"name": "steps", "shape": [1], "datatype": "INT64", "data": [5000]},
                     {"name": "image", "shape": [1], "datatype": "BYTES", "data": [TINY]}]},
         b"", None, "steps"),
        ({"inputs": [{"name": "amount", "shape": [1], "datatype": "FP64",
                      "parameters": {"binary_data_size": 8}}]},
         struct.pack("<d", float("nan")), None, "amount"),
        ({"inputs": [{"name": "steps", "shape": [1, -1], "datatype": "INT64", "data": [1]}]},
         b"", None, "steps"),
        ({"inputs": []}, b"", None, "inputs"),
    ],
)  # fmt: skip
def test_bodies_that_lie_are_400s_naming_the_input(
    sharpen: RunningServer, head: dict, binary: bytes, declared: int | None, named: str
) -> None:
    status, doc = lying(sharpen, head, binary, declared)
    assert status == 400 and named in doc["error"], doc


def test_auth_and_unknown_model(sharpen: RunningServer) -> None:
    body = json.dumps({"inputs": [{"name": "steps", "shape": [1], "datatype": "INT64",
                                   "data": [1]}]}).encode()  # fmt: skip
    assert sharpen.request("POST", "/v2/models/SDK_SHARPEN/infer", body)[0] == 401
    assert sharpen.request("POST", "/v2/models/OTHER/infer", body, AUTH)[0] == 404
    status, _h, raw = sharpen.request("POST", "/v2/models/SDK_SHARPEN/infer", b"{x", AUTH)
    assert status == 400 and "not JSON" in json.loads(raw)["error"]
    assert sharpen.request("GET", "/v2/health/live")[0] == 200  # public, as /healthz
