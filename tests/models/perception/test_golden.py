"""Golden outputs of the shipped, trained weights on the seeded demo pictures.

Tolerances: scores within 2e-3 and box coordinates within 0.5 px of the recorded
values (float differences across CPUs and thread counts are far below that; a
retrained model changes them and must update this file together with the weights).
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

import numpy as np
import pytest

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.models.registry import create_model
from tests.models.perception.conftest import DEMO, ROOT
from training.perception.metrics import box_iou_np

SCORE_TOL = 2e-3
BOX_TOL = 0.5

# Recorded with the shipped weights (python - see each test's docstring).
MNV2_GOLDEN = {0: 0.98831, 8: 0.87504}  # top probability of digit_0.png, digit_8.png
RTDETR_GOLDEN = [
    ("circle", 0.959674, [8.07, 42.48, 29.2, 64.0]),
    ("rectangle", 0.954582, [12.81, 7.58, 43.7, 35.19]),
]


def _model(model_type: str, config: str) -> Model:
    return create_model(model_type, tomllib.loads((ROOT / config).read_text()), ROOT)


def _run(model: Model, name: str, **params: Any) -> Any:
    req = InferenceRequest("golden", ((DEMO / name).read_bytes(),), params)
    return model.run(model.validate(req), RunContext())


GROUND_TRUTH = json.loads((DEMO / "ground_truth.json").read_text())


@pytest.fixture(scope="module")
def yolo() -> Model:
    return _model("YOLOV8", "conf/model/object_detection/yolov8.toml")


def test_yolo_golden_scene_1(yolo: Model) -> None:
    """Demo scene 1 gives exactly the recorded two detections."""
    golden = [
        ("circle", 0.949786, [8.26, 42.02, 29.03, 63.82]),
        ("rectangle", 0.934754, [13.25, 6.61, 43.55, 36.13]),
    ]
    dets = _run(yolo, "scene_1.png")
    assert len(dets) == len(golden)
    for det, (category, score, bbox) in zip(dets, golden, strict=True):
        assert det["category"] == category
        assert det["score"] == pytest.approx(score, abs=SCORE_TOL)
        np.testing.assert_allclose(det["bbox"], bbox, atol=BOX_TOL)


@pytest.mark.parametrize(("name", "min_iou"), [("scene_0.png", 0.7), ("scene_wide.png", 0.5)])
def test_yolo_finds_every_demo_object(yolo: Model, name: str, min_iou: float) -> None:
    """Every ground-truth object of a demo scene (also a non-square, rescaled one) is
    found at IoU >= min_iou in input-picture pixels."""
    truth = GROUND_TRUTH[name]
    dets = _run(yolo, name)
    iou = box_iou_np(np.array(truth["boxes"]), np.array([d["bbox"] for d in dets]))
    assert (iou.max(1) >= min_iou).all(), iou


@pytest.fixture(scope="module")
def rtdetr() -> Model:
    return _model("OBJECT_DETECTION", "conf/model/object_detection/rtdetr.toml")


@pytest.mark.parametrize(
    ("name", "min_iou", "classes"),
    [("scene_0.png", 0.65, False), ("scene_1.png", 0.9, True), ("scene_wide.png", 0.5, False)],
)
def test_rtdetr_finds_every_demo_object(
    rtdetr: Model, name: str, min_iou: float, classes: bool
) -> None:
    """Every ground-truth object of a demo scene (also a non-square, rescaled one) is
    found by the transformers RT-DETR at IoU >= min_iou in input-picture pixels; on
    scene 1 with its class (on scene 0 the shipped weights call a half-hidden rectangle
    a triangle: mAP@0.5 is 0.83, YOLOV8's 0.97)."""
    truth = GROUND_TRUTH[name]
    dets = _run(rtdetr, name)
    boxes = np.array([d["bbox"] for d in dets]).reshape(-1, 4)
    iou = box_iou_np(np.array(truth["boxes"]), boxes)
    assert (iou.max(1) >= min_iou).all(), iou
    for row, category in zip(iou, truth["categories"], strict=True):
        assert not classes or dets[int(row.argmax())]["category"] == category


def test_rtdetr_golden_scene_1(rtdetr: Model) -> None:
    """Demo scene 1 gives the recorded detections (scores and boxes)."""
    dets = _run(rtdetr, "scene_1.png")
    assert len(dets) == len(RTDETR_GOLDEN)
    for det, (category, score, bbox) in zip(dets, RTDETR_GOLDEN, strict=True):
        assert det["category"] == category
        assert det["score"] == pytest.approx(score, abs=SCORE_TOL)
        np.testing.assert_allclose(det["bbox"], bbox, atol=BOX_TOL)


@pytest.fixture(scope="module")
def mobilenet() -> Model:
    return _model("MOBILENETV2", "conf/model/classification/mobilenetv2.toml")


@pytest.mark.parametrize("label", range(10))
def test_mobilenet_classifies_demo_digits(mobilenet: Model, label: int) -> None:
    """Each plain demo digit gets its label."""
    assert _run(mobilenet, f"digit_{label}.png")["class_id"] == label


def test_mobilenet_classifies_demo_digits_on_noisy_canvas(mobilenet: Model) -> None:
    """At least 9 of the 10 demo digits on the noisy shifted canvas get their label (the
    shipped weights: 98.9 % on 1,077 such pictures; digit_canvas_8.png reads as 1)."""
    hits = [
        _run(mobilenet, f"digit_canvas_{label}.png")["category"] == str(label)
        for label in range(10)
    ]
    assert sum(hits) >= 9, hits


def test_mobilenet_golden_scores(mobilenet: Model) -> None:
    """Recorded top probabilities of two demo digits (label smoothing caps them ~0.96)."""
    assert max(_run(mobilenet, "digit_0.png")["scores"]) == pytest.approx(
        MNV2_GOLDEN[0], abs=SCORE_TOL
    )
    assert max(_run(mobilenet, "digit_8.png")["scores"]) == pytest.approx(
        MNV2_GOLDEN[8], abs=SCORE_TOL
    )


def test_mobilenet_dark_ink_on_white(mobilenet: Model) -> None:
    """A digit drawn dark on a light background (inverted demo digit) is still read."""
    from PIL import Image, ImageOps

    from tests.models.perception.conftest import png_bytes

    inverted = np.asarray(ImageOps.invert(Image.open(DEMO / "digit_7.png").convert("RGB")))
    req = InferenceRequest("inv", (png_bytes(inverted),))
    assert mobilenet.run(mobilenet.validate(req), RunContext())["class_id"] == 7


# SAM_AMG on demo scene 1 with the shipped config: recorded mask count, the first
# (highest predicted IoU) mask's area and box, and each instance's best-match IoU.
SAM_GOLDEN = {"count": 6, "first_area": 374, "first_bbox": [8, 32, 21, 32], "min_best_iou": 0.9}


def test_sam_amg_golden_scene_1() -> None:
    """The generator's masks on demo scene 1 match the recorded ones, and every
    ground-truth instance is covered by some mask at IoU >= min_best_iou."""
    from mortred_twisted.data.scenes import scene_split
    from mortred_twisted.models.transformers_tasks.sam.masks import rle_to_mask
    from training.perception.metrics import mask_matching

    model = _model("SAM_AMG", "conf/model/segment_anything/sam_amg.toml")
    data = _run(model, "scene_1.png")
    masks = data["masks"]
    assert len(masks) == SAM_GOLDEN["count"]
    assert masks[0]["area"] == pytest.approx(SAM_GOLDEN["first_area"], abs=3)
    np.testing.assert_allclose(masks[0]["bbox"], SAM_GOLDEN["first_bbox"], atol=1)
    pred = np.stack([rle_to_mask(m["segmentation"]) for m in masks])
    best = mask_matching(pred, scene_split("demo", 2)[1].masks)
    assert (best >= SAM_GOLDEN["min_best_iou"]).all(), best


def _jpeg(name: str, quality: int = 90) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.open(DEMO / name).convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def test_jpeg_inputs_give_the_png_answers(mobilenet: Model, yolo: Model) -> None:
    """JPEG-encoded demo pictures (quality 90) get the same class and boxes within
    IoU 0.9 of the PNG originals."""
    req = InferenceRequest("jpeg", (_jpeg("digit_canvas_5.png"),))
    assert mobilenet.run(mobilenet.validate(req), RunContext())["class_id"] == 5
    png_dets = _run(yolo, "scene_1.png")
    jpg_dets = yolo.run(yolo.validate(InferenceRequest("j", (_jpeg("scene_1.png"),))), RunContext())
    assert [d["category"] for d in jpg_dets] == [d["category"] for d in png_dets]
    iou = box_iou_np(
        np.array([d["bbox"] for d in png_dets]), np.array([d["bbox"] for d in jpg_dets])
    )
    assert (np.diag(iou) >= 0.9).all()
