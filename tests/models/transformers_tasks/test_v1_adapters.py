"""The ``mortred-v1`` adapters (issue 38) answer from their task model: a shipped
entry's legacy ``data`` carries the same classes, labels, scores and boxes as the
task model inside it answers on the same picture (scores and boxes within float
noise: the two outputs round alike but are compared with a tolerance, never bit for
bit), and the adapter's task *is* that model's instance (one set of weights)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.transformers_tasks.classification import ImageClassifier
from mortred_twisted.models.transformers_tasks.detection import ObjectDetector
from mortred_twisted.models.transformers_tasks.mask_generation import MaskGenerator
from mortred_twisted.sdk import Context, Image

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "demo_data" / "perception"


def shipped(model_type: str, config: str) -> Model:
    return create_model(model_type, tomllib.loads((ROOT / config).read_text()), ROOT)


def legacy(model: Model, picture: bytes, **params: Any) -> Any:
    request = model.validate(InferenceRequest("v1", (picture,), params))
    return model.run(request, RunContext())


def task_answer(task: Any, picture: bytes, **inputs: Any) -> Any:
    out = task.predict_batch(Context(), [{"image": Image(picture), **inputs}])[0]
    if isinstance(out, BaseException):
        raise out
    return out


def test_the_classifier_answers_from_its_task_model() -> None:
    """MOBILENETV2's top_k list is the task's labels, ids and scores, in order."""
    model = shipped("MOBILENETV2", "conf/model/classification/mobilenetv2.toml")
    assert isinstance(model.instance.task, ImageClassifier)
    picture = (DEMO / "digit_canvas_4.png").read_bytes()
    data = legacy(model, picture, top_k=5)
    task = task_answer(model.instance.task, picture, top_k=5)
    assert [e["class_id"] for e in data["top_k"]] == task.class_ids
    assert [e["category"] for e in data["top_k"]] == task.labels
    assert [e["score"] for e in data["top_k"]] == pytest.approx(task.scores, abs=1e-6)
    assert data["class_id"] == task.class_ids[0]
    assert sum(data["scores"]) == pytest.approx(1.0, abs=1e-4)


def test_the_detector_answers_from_its_task_model() -> None:
    """RTDETR's records are the task's detections at the same score threshold when
    NMS suppresses nothing (IoU threshold 1) and the top k keeps all."""
    model = shipped("OBJECT_DETECTION", "conf/model/object_detection/rtdetr.toml")
    assert isinstance(model.instance.task, ObjectDetector)
    picture = (DEMO / "scene_1.png").read_bytes()
    params = {"model_score_threshold": 0.2, "model_nms_threshold": 1.0, "model_keep_top_k": 300}
    records = legacy(model, picture, **params)
    task = task_answer(model.instance.task, picture, threshold=0.2, max_detections=300)
    assert records, "the scene has shapes above 0.2"
    assert [r["class_id"] for r in records] == task.class_ids
    assert [r["category"] for r in records] == task.labels
    assert [r["score"] for r in records] == pytest.approx(task.scores, abs=1e-6)
    for record, box in zip(records, task.boxes, strict=True):
        assert record["bbox"] == pytest.approx(box, abs=0.011)


def test_the_mask_generator_runs_its_task_models_generator() -> None:
    """SAM_AMG's generator and AMG defaults are its task model's (one generator)."""
    model = shipped("SAM_AMG", "conf/model/segment_anything/sam_amg.toml")
    task = model.instance
    assert task.generator.prompter is not None
    built = create_model(
        "transformers",
        {"pretrained": "weights/perception/sam_amg", "task": "mask-generation"},
        ROOT,
    ).instance
    assert isinstance(built, MaskGenerator)
    # the same directory and device: one shared SamModel for both contracts
    assert built.generator.prompter.model is task.generator.prompter.model
