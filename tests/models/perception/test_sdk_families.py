"""The perception families are declared with the SDK (issue 26 item 4): each shipped
server file (the built-in type and the ``transformers`` + ``mortred-v1`` entry) builds
an ``SdkModel`` around the family's ``ServedModel``; its validation twin, sent as JSON
and never as the family's class, validates exactly like the loaded model; the OpenAPI
params are the seed's, unchanged; and the sync batch is one forward pass in which each
item fails alone."""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest

from mortred_twisted.config.server import load_server_config
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.model_api.base import InferenceRequest, InputDecodeError, Model, RunContext
from mortred_twisted.models.isolated import validation_twin
from mortred_twisted.models.mortred_v1.classification import ImageClassificationModel
from mortred_twisted.models.mortred_v1.detection import ObjectDetectionModel
from mortred_twisted.models.mortred_v1.mask_generation import SamAmgModel
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.yolov8.family import YoloV8Model
from mortred_twisted.sdk.adapter import SdkModel
from mortred_twisted.sdk.seed_contract import sdk_declaration
from mortred_twisted.testing.closeness import assert_json_close
from tests.models.perception.conftest import DEMO, ROOT

CLASSIFIER = "conf/server/classification/mobilenetv2.toml"
YOLO = "conf/server/object_detection/yolov8.toml"
DETECTOR = "conf/server/object_detection/rtdetr.toml"
SAM = "conf/server/segment_anything/sam_amg.toml"

#: (server file, the type it is built as: None for the file's own) -> family class
BUILDS: dict[tuple[str, str | None], type] = {
    (CLASSIFIER, None): ImageClassificationModel,
    (CLASSIFIER, "MOBILENETV2"): ImageClassificationModel,
    (CLASSIFIER, "IMAGE_CLASSIFICATION"): ImageClassificationModel,
    (YOLO, None): YoloV8Model,
    (DETECTOR, None): ObjectDetectionModel,
    (DETECTOR, "OBJECT_DETECTION"): ObjectDetectionModel,
    (SAM, None): SamAmgModel,
    (SAM, "SAM_AMG"): SamAmgModel,
}

_UNIT = {"maximum": 1.0, "minimum": 0.0, "type": "number"}
_DETECTOR_PARAMS = {
    "model_score_threshold": {
        **_UNIT,
        "description": "minimum class score (default from the config)",
    },
    "model_nms_threshold": {
        **_UNIT,
        "description": "IoU above which a lower-scoring box is suppressed",
    },
    "model_keep_top_k": {
        "description": "maximum detections returned per image",
        "maximum": 10000,
        "minimum": 1,
        "type": "integer",
    },
}
#: The seed's OpenAPI ``params`` of each family (as the Model classes documented them).
SEED_PARAMS: dict[str, dict[str, Any]] = {
    CLASSIFIER: {
        "top_k": {
            "description": "if set, also return the top_k classes as 'top_k'",
            "maximum": 1000,
            "minimum": 1,
            "type": "integer",
        }
    },
    YOLO: _DETECTOR_PARAMS,
    DETECTOR: _DETECTOR_PARAMS,
    SAM: {
        "points_per_side": {
            "description": "prompt grid is points_per_side^2 points",
            "maximum": 64,
            "minimum": 1,
            "type": "integer",
        },
        "points_per_batch": {
            "description": "prompts decoded per batch (one progress step each); at most 256 "
            "bounds the decoder's working memory",
            "maximum": 256,
            "minimum": 1,
            "type": "integer",
        },
        "pred_iou_thresh": _UNIT,
        "stability_score_thresh": _UNIT,
        "stability_score_offset": {"maximum": 100.0, "minimum": 0.0, "type": "number"},
        "box_nms_thresh": _UNIT,
        "min_mask_region_area": {"maximum": 16777216, "minimum": 0, "type": "integer"},
        "crop_n_layers": {
            "description": "extra layers of overlapping crops (layer i: 2^i x 2^i crops), "
            "each embedded once; 0 = the whole picture only",
            "maximum": 3,
            "minimum": 0,
            "type": "integer",
        },
        "crop_overlap_ratio": {
            "description": "overlap of neighbouring crops, as a share of the picture's short "
            "side (scaled by 2 / crops per side)",
            "maximum": 0.9,
            "minimum": 0.0,
            "type": "number",
        },
        "crop_n_points_downscale_factor": {
            "description": "each crop layer's point grid has this factor fewer points per side",
            "maximum": 16,
            "minimum": 1,
            "type": "integer",
        },
        "crop_nms_thresh": {
            **_UNIT,
            "description": "box IoU above which a mask of a larger crop is dropped",
        },
        "max_masks": {
            "description": "masks returned per image at most (highest predicted IoU first); "
            "bounds the full-size masks held",
            "maximum": 256,
            "minimum": 1,
            "type": "integer",
        },
        "output_mode": {
            "default": "uncompressed_rle",
            "enum": ["uncompressed_rle", "binary_mask_png"],
            "type": "string",
        },
        "return_overlay": {
            "default": False,
            "description": "also return a colourised overlay PNG (base64)",
            "type": "boolean",
        },
    },
}

PICTURE = (DEMO / "scene_1.png").read_bytes()
DIGIT = (DEMO / "digit_3.png").read_bytes()


def build(path: str, model_type: str | None) -> tuple[Any, Model]:
    """The server file's config and its model, built by the registry as a server does
    (input limits from the file); ``model_type`` replaces the file's type (and drops
    the ``transformers`` keys)."""
    config = load_server_config(ROOT / path, env={})
    options = dict(config.model_options)
    kind = config.model_type
    if model_type is not None:
        kind = model_type
        options = {k: v for k, v in options.items() if k not in ("task", "contract")}
    return config, create_model(kind, options, ROOT)


@pytest.fixture(scope="module")
def built() -> Callable[[str, str | None], tuple[Any, Model]]:
    """Models built once per module (weights are shared by the families anyway)."""
    cache: dict[tuple[str, str | None], tuple[Any, Model]] = {}

    def get(path: str, model_type: str | None) -> tuple[Any, Model]:
        if (path, model_type) not in cache:
            cache[path, model_type] = build(path, model_type)
        return cache[path, model_type]

    return get


def _requests(path: str, limit: int) -> list[InferenceRequest]:
    """Requests each family must answer alike: good and defaulted params, a bound, an
    unknown key, a wrong type, params not an object, no images, too many images, an
    undecodable header, a key of another family."""
    picture = DIGIT if path == CLASSIFIER else PICTURE
    first = next(iter(SEED_PARAMS[path]))
    given: dict[str, Any] = {
        CLASSIFIER: {"top_k": 3},
        YOLO: {"model_score_threshold": 0.3, "model_keep_top_k": 2},
        DETECTOR: {"model_nms_threshold": 0.6},
        SAM: {"points_per_side": 4, "return_overlay": True, "pred_iou_thresh": 0.1},
    }[path]
    params: list[Any] = [
        given,
        {},
        None,
        {first: -1},
        {first: "x"},
        {"nope": 1},
        {"top_k": 2, "points_per_side": 2},
        "not an object",
        [1, 2],
    ]
    out = [InferenceRequest("r", (picture,), p) for p in params]  # type: ignore[arg-type]
    out += [
        InferenceRequest("r", (), {}),
        InferenceRequest("r", (picture,) * (limit + 1), {}),
        InferenceRequest("r", (b"not a picture",), {}),
        InferenceRequest("r", (picture, picture), given),
    ]
    return out


def outcome(model: Model, request: InferenceRequest) -> tuple[Any, ...]:
    """What validation answers: the checked request, or the error (type, field, text)."""
    try:
        checked = model.validate(request)
    except Exception as exc:
        message = re.sub(r" at 0x[0-9a-f]+", "", str(exc))
        return (type(exc).__name__, getattr(exc, "field", None), message)
    return ("ok", checked.images, json.dumps(checked.params, sort_keys=True))


@pytest.mark.parametrize(("path", "model_type"), sorted(BUILDS, key=str))
def test_each_entry_is_the_family_served_through_the_sdk(
    built: Callable[[str, str | None], tuple[Any, Model]], path: str, model_type: str | None
) -> None:
    """The model is an SdkModel with the seed's contract around the family's class,
    and its documented params and output are the seed's."""
    config, model = built(path, model_type)
    assert isinstance(model, SdkModel) and type(model.instance) is BUILDS[path, model_type]
    assert model.declaration.contract == "mortred-v1" and model.uses_images
    assert model.output_schema == BUILDS[path, model_type].output_schema is not None
    doc = build_openapi(config, model.params_schema, model.output_schema, sdk_declaration(model))
    params = doc["components"]["schemas"]["Request"]["properties"]["params"]["properties"]
    assert params == SEED_PARAMS[path]
    assert list(params) == list(SEED_PARAMS[path])  # the documented order too
    assert doc["components"]["schemas"]["ModelOutput"] == model.output_schema


@pytest.mark.parametrize(("path", "model_type"), sorted(BUILDS, key=str))
def test_the_twin_validates_like_the_loaded_model(
    built: Callable[[str, str | None], tuple[Any, Model]], path: str, model_type: str | None
) -> None:
    """The pickled twin (what a process worker sends back) is the declaration as JSON:
    no family class, no instance; every request gets the loaded model's answer, 422,
    413 and 400 messages included."""
    _, model = built(path, model_type)
    payload = pickle.dumps(validation_twin(model))
    assert b"mortred_twisted.models." not in payload  # the class never travels
    twin = pickle.loads(payload)
    assert isinstance(twin, SdkModel) and twin.instance is None
    assert twin.declaration == model.declaration and twin.input_limits == model.input_limits
    assert list(twin.params_schema) == list(model.params_schema)
    assert twin.output_schema == model.output_schema
    limit = model.input_limits.max_images if model.input_limits is not None else 8
    answers = [(outcome(model, r), outcome(twin, r)) for r in _requests(path, limit or 8)]
    for loaded, from_twin in answers:
        assert loaded == from_twin
    kinds = [a[0][0] for a in answers]
    assert kinds.count("ok") >= 3 and "InvalidRequest" in kinds and "InputTooLarge" in kinds
    assert ("InvalidRequest", "images", "images: at least one image is required") in [
        a[0] for a in answers
    ]


#: family with a batched forward pass -> the instance method that runs it
FORWARD = {CLASSIFIER: "probabilities", YOLO: "forward", DETECTOR: "forward"}


@pytest.mark.parametrize("path", sorted(FORWARD))
def test_a_sync_batch_is_one_forward_pass_and_items_fail_alone(
    built: Callable[[str, str | None], tuple[Any, Model]],
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run_batch goes to predict_batch: one forward pass for the good items, an
    undecodable picture fails its own item (400), and each good item's data is the
    answer it gets alone: the same classes, boxes' labels and sizes, and floats equal
    up to the noise of the batched kernels (which ones torch picks depends on the
    batch size and the CPU: AVX2, AVX-512, AMX), never bit for bit."""
    _, model = built(path, None)
    assert model.declaration.max_batch_size > 1
    picture = DIGIT if path == CLASSIFIER else PICTURE
    params = {CLASSIFIER: {"top_k": 2}, YOLO: {}, DETECTOR: {"model_score_threshold": 0.2}}[path]
    reqs = [
        model.validate(InferenceRequest("a", (picture,), params)),
        InferenceRequest("b", (b"not a picture",), {}),
        model.validate(InferenceRequest("c", (picture, picture), {})),
    ]
    alone = [model.run(r, RunContext()) for r in (reqs[0], reqs[2])]
    instance = model.instance
    real = getattr(instance, FORWARD[path])
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(instance, FORWARD[path], counting)
    out = model.run_batch(reqs, [RunContext() for _ in reqs])
    assert len(calls) == 1
    assert isinstance(out[1], InputDecodeError)
    assert_json_close([out[0], out[2]], alone)


def test_sam_runs_requests_one_by_one(
    built: Callable[[str, str | None], tuple[Any, Model]],
) -> None:
    """SAM_AMG declares no batched pass: a batch is each request's own run (a bad
    picture fails alone)."""
    _, model = built(SAM, None)
    assert model.declaration.max_batch_size == 1
    good = model.validate(InferenceRequest("a", (PICTURE,), {"points_per_side": 2}))
    out = model.run_batch([good, InferenceRequest("b", (b"junk",), {})], [RunContext()] * 2)
    assert out[0]["masks"] is not None and isinstance(out[1], InputDecodeError)
