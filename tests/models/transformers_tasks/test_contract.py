"""``contract = "mortred-v1"``: a shipped catalog entry's server file with ``type =
"transformers"`` answers exactly as its built-in type does (same params, 422
messages, ``data``, input limits, batching), and the option is checked."""

from __future__ import annotations

import base64
import importlib
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.registry import MODEL_FACTORIES, create_model
from mortred_twisted.models.transformers_tasks.contract import MORTRED_V1, V1_FAMILIES
from mortred_twisted.testing.server import Answer
from tests.models.transformers_tasks.conftest import TransformersServer

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "demo_data" / "perception"


def b64(name: str) -> str:
    return base64.b64encode((DEMO / name).read_bytes()).decode()


#: Shipped server file -> (its built-in type, its task, a picture, quick params, a
#: param the model refuses).
ENTRIES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any]]] = {
    "conf/server/classification/mobilenetv2.toml": (
        "MOBILENETV2",
        "image-classification",
        "digit_3.png",
        {"top_k": 3},
        {"top_k": 0},
    ),
    "conf/server/object_detection/rtdetr.toml": (
        "OBJECT_DETECTION",
        "object-detection",
        "scene_1.png",
        {"model_score_threshold": 0.3},
        {"model_nms_threshold": 2.0},
    ),
    "conf/server/segment_anything/sam_amg.toml": (
        "SAM_AMG",
        "mask-generation",
        "scene_1.png",
        {"points_per_side": 4, "return_overlay": True},
        {"points_per_side": 0},
    ),
}


class ConfigServer(TransformersServer):
    """The in-memory server of a server TOML (its model built by the registry)."""

    def __init__(self, path: Path, model_type: str, **model: Any) -> None:
        from mortred_twisted.config.server import build_server_config

        doc = tomllib.loads(path.read_text(encoding="utf-8"))
        shipped = doc["model"]
        if model_type != "transformers":  # the built-in type takes no task/contract keys
            shipped = {k: v for k, v in shipped.items() if k not in ("task", "contract")}
        doc["model"] = {**shipped, "type": model_type, **model}
        doc["server"] = {**doc["server"], "auth_token": ""}
        self._start(build_server_config(doc, root=ROOT, env={}), None, create_model)


@pytest.fixture(scope="module", params=sorted(ENTRIES))
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[str, ConfigServer, ConfigServer]]:
    """The entry served by its built-in type and by ``transformers`` + mortred-v1."""
    path = request.param
    builtin_type = ENTRIES[path][0]
    builtin = ConfigServer(ROOT / path, builtin_type)
    v1 = ConfigServer(ROOT / path, "transformers", contract=MORTRED_V1)
    yield path, builtin, v1
    builtin.close()
    v1.close()


def answers(server: ConfigServer, route: str, docs: list[Any]) -> list[Answer]:
    """Post ``docs`` together and let server time pass (the batch delay) until each
    is answered; the answers in ``docs`` order."""
    got: dict[int, Answer] = {}
    for i, doc in enumerate(docs):
        d = server.request_d("POST", route, json=doc)
        d.addCallback(lambda answer, i=i: got.__setitem__(i, answer))
    for _ in range(100):
        if len(got) == len(docs):
            break
        server.advance(0.01)
    assert len(got) == len(docs), "no answer"
    return [got[i] for i in range(len(docs))]


def without_id(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without a generated req_id, and with object addresses in its message
    (Pillow's ``<_io.BytesIO object at 0x…>``) blanked."""
    out = {k: v for k, v in doc.items() if k != "req_id" or not str(v).startswith("req_")}
    if isinstance(out.get("msg"), str):
        out["msg"] = re.sub(r" at 0x[0-9a-f]+", " at 0x", out["msg"])
    return out


def same(builtin: ConfigServer, v1: ConfigServer, route: str, doc: Any) -> Answer:
    """Post ``doc`` to both; assert the same status and JSON answer; return one."""
    a = answers(builtin, route, [doc])[0]
    b = answers(v1, route, [doc])[0]
    # a refusal before the envelope is read names a fresh req_id of its own
    assert (a.code, without_id(a.json())) == (b.code, without_id(b.json())), (route, doc)
    return a


def test_the_v1_families_are_the_builtin_types_factories() -> None:
    """The contract is the built-in family's own code, not a copy beside it."""
    assert {
        "image-classification": MODEL_FACTORIES["IMAGE_CLASSIFICATION"],
        "object-detection": MODEL_FACTORIES["OBJECT_DETECTION"],
        "mask-generation": MODEL_FACTORIES["SAM_AMG"],
    } == V1_FAMILIES
    assert MODEL_FACTORIES["MOBILENETV2"] == MODEL_FACTORIES["IMAGE_CLASSIFICATION"]


def test_answers_match_the_builtin_type(pair: tuple[str, ConfigServer, ConfigServer]) -> None:
    """One picture, two pictures, the legacy params, a bad param, no ``images``, an
    unknown envelope field and an undecodable picture: same status, same JSON."""
    path, builtin, v1 = pair
    _, _, picture, quick, bad = ENTRIES[path]
    route = builtin.config.server_uri
    one = same(builtin, v1, route, {"req_id": "a", "images": [b64(picture)], "params": quick})
    assert one.code == 200 and "results" not in one.json()["data"]
    two = same(builtin, v1, route, {"req_id": "b", "images": [b64(picture)] * 2, "params": quick})
    assert two.code == 200 and len(two.json()["data"]["results"]) == 2
    assert same(builtin, v1, route, {"req_id": "c", "img_data": b64(picture)}).code == 200
    refused = same(builtin, v1, route, {"req_id": "d", "images": [b64(picture)], "params": bad})
    assert refused.code == 422
    missing = same(builtin, v1, route, {"req_id": "e", "params": quick})
    assert missing.code == 422
    assert "images: required (an array of base64-encoded images)" in missing.json()["msg"]
    assert same(builtin, v1, route, {"req_id": "f", "images": [b64(picture)], "x": 1}).code == 422
    junk = base64.b64encode(b"not a picture").decode()
    assert same(builtin, v1, route, {"req_id": "g", "images": [junk]}).code == 400


def test_a_form_submit_is_refused_as_by_the_builtin_type(
    pair: tuple[str, ConfigServer, ConfigServer],
) -> None:
    """The seed contract takes JSON only: a multipart submit is the built-in's 415
    (the SDK contract would parse it)."""
    _, builtin, v1 = pair
    body = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--b--\r\n'
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    route = builtin.config.server_uri
    a = builtin.request("POST", route, body=body, headers=headers)
    b = v1.request("POST", route, body=body, headers=headers)
    assert a.code == b.code == 415
    assert without_id(a.json()) == without_id(b.json())
    assert a.json()["msg"].endswith("content type must be application/json")


def test_limits_schemas_and_batching_match(pair: tuple[str, ConfigServer, ConfigServer]) -> None:
    """Same input limits (413 above max_images), params and output schemas, the
    family's own ``run_batch``, and concurrent requests batched answered the same."""
    path, builtin, v1 = pair
    _, _, picture, quick, _ = ENTRIES[path]
    a, b = builtin.runtime.validator, v1.runtime.validator
    assert type(a) is type(b)
    assert a.input_limits == b.input_limits
    assert list(a.params_schema) == list(b.params_schema)
    assert a.output_schema == b.output_schema
    assert (a.uses_images, a.run_capacity) == (b.uses_images, b.run_capacity)
    assert type(a).run_batch is type(b).run_batch
    batching = ("max_batch_size", "max_batch_delay_ms", "max_queue_depth", "worker_nums")
    assert [getattr(builtin.config, k) for k in batching] == [
        getattr(v1.config, k) for k in batching
    ]
    route = builtin.config.server_uri
    too_many = [b64(picture)] * (a.input_limits.max_images + 1)
    assert same(builtin, v1, route, {"req_id": "h", "images": too_many}).code == 413
    docs = [{"req_id": f"q{i}", "images": [b64(picture)], "params": quick} for i in range(3)]
    batched = [[(x.code, x.json()) for x in answers(s, route, docs)] for s in (builtin, v1)]
    assert batched[0] == batched[1] and {code for code, _ in batched[0]} == {200}


def test_ready_names_the_configured_type(pair: tuple[str, ConfigServer, ConfigServer]) -> None:
    """/ready reports the server file's type (the one visible difference)."""
    path, builtin, v1 = pair
    assert builtin.request("GET", "/ready").json()["model"] == ENTRIES[path][0]
    assert v1.request("GET", "/ready").json()["model"] == "transformers"


def test_an_unknown_contract_is_a_load_error(layout: Callable[[str], Path]) -> None:
    options = {"pretrained": str(layout("image-classification")), "contract": "v0"}
    with pytest.raises(ModelLoadError, match="unknown contract 'v0'; known: 'sdk', 'mortred-v1'"):
        create_model("transformers", options, ROOT)


@pytest.mark.parametrize(
    "task", ["zero-shot-image-classification", "image-segmentation", "depth-estimation"]
)
def test_a_task_without_a_seed_contract_is_named(layout: Callable[[str], Path], task: str) -> None:
    options = {"pretrained": str(layout(task)), "contract": MORTRED_V1}
    named = f"contract 'mortred-v1' is defined for .*not '{task}'"
    with pytest.raises(ModelLoadError, match=named):
        create_model("transformers", options, ROOT)


def test_the_v1_contract_needs_the_manifest(layout: Callable[[str], Path]) -> None:
    """A public-layout directory without manifest.json: the family's own check."""
    options = {"pretrained": str(layout("image-classification")), "contract": MORTRED_V1}
    with pytest.raises(ModelLoadError, match="manifest"):
        create_model("transformers", options, ROOT)


def test_the_sdk_contract_is_the_default(layout: Callable[[str], Path]) -> None:
    """Without ``contract`` (or with ``"sdk"``) the task model is served."""
    directory = str(layout("image-classification"))
    cls = importlib.import_module("mortred_twisted.sdk.adapter")
    for extra in ({}, {"contract": "sdk"}):
        model = create_model("transformers", {"pretrained": directory, **extra}, ROOT)
        assert type(model).__module__ == cls.__name__
        model.close()
