"""Each task of ``type = "transformers"`` served end to end from a tiny public-layout
directory: jobs through the model port, 422s for bad inputs, result files."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mortred_twisted.sdk import Image as SdkImage
from tests.models.transformers_tasks.conftest import png

Serve = Callable[..., object]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def infer(srv, params: dict[str, object]):
    """A sync ``POST /infer``, answered once the batching wait has passed."""
    got: list[object] = []
    srv.request_d("POST", "/infer", json={"params": params}).addBoth(got.append)
    srv.advance(1.0)
    assert got, "no answer to /infer"
    return got[0]


def test_classifier_job_returns_top_k_labels_in_order(layout, serve) -> None:
    """A ViT directory classifies a picture as a job: top_k labels, scores descending."""
    srv = serve(layout("image-classification"))
    data = srv.run(image=b64(png()), top_k=3)["data"]
    assert len(data["labels"]) == len(data["scores"]) == len(data["class_ids"]) == 3
    assert data["scores"] == sorted(data["scores"], reverse=True)
    assert all(
        label == f"class_{i}" for label, i in zip(data["labels"], data["class_ids"], strict=True)
    )
    assert 0.0 < sum(data["scores"]) <= 1.0 + 1e-6


def test_classifier_caps_top_k_at_the_classes_and_refuses_zero(layout, serve) -> None:
    """top_k above the number of classes returns every class; top_k 0 is a 422."""
    srv = serve(layout("image-classification"))
    data = srv.run(image=b64(png()), top_k=50)["data"]
    assert sorted(data["class_ids"]) == list(range(10))
    answer = srv.submit(image=b64(png()), top_k=0)
    assert answer.code == 422, answer
    assert "top_k" in answer.body.decode()


def test_seed_envelope_images_fill_the_image_input(layout, serve) -> None:
    """The seed envelope's ``images`` is the picture when params name none."""
    srv = serve(layout("image-classification"))
    job = srv.submit(images=[b64(png())], top_k=2).json()
    assert srv.wait(job["job_id"])["state"] == "done"
    assert len(srv.result(job["job_id"])["data"]["labels"]) == 2


def test_missing_or_undecodable_image_is_refused(layout, serve) -> None:
    """No picture is a 422 naming the input; bytes that are no picture are refused
    before admission."""
    srv = serve(layout("image-classification"))
    answer = srv.submit(top_k=2)
    assert answer.code == 422 and "image" in answer.body.decode(), answer
    answer = srv.submit(image=b64(b"not a picture at all"))
    assert answer.code in (400, 422), answer


def test_multipart_form_submits_a_picture(layout, serve) -> None:
    """A ``transformers`` model takes multipart/form-data like any SDK model."""
    srv = serve(layout("image-classification"))
    picture = png()
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + picture + b"\r\n"
        b'--XyZ\r\nContent-Disposition: form-data; name="top_k"\r\n\r\n2\r\n--XyZ--\r\n'
    )
    answer = srv.request(
        "POST", "/jobs", body=body, headers={"Content-Type": "multipart/form-data; boundary=XyZ"}
    )
    assert answer.code == 202, answer
    job = answer.json()["job_id"]
    assert srv.wait(job)["state"] == "done"
    assert len(srv.result(job)["data"]["labels"]) == 2


def test_a_batch_matches_one_at_a_time_and_a_bad_item_fails_alone(layout) -> None:
    """predict_batch gives each picture what predict gives it; an undecodable picture
    fails its own item only."""
    from mortred_twisted.model_api.base import InputDecodeError
    from mortred_twisted.models.registry import create_model
    from mortred_twisted.sdk import Context

    model = create_model(
        "transformers", {"pretrained": str(layout("image-classification"))}, Path(".")
    )
    instance = model.instance
    pictures = [SdkImage(png(200, 150, 1)), SdkImage(png(64, 90, 2))]
    alone = [instance.predict(Context(), image=p, top_k=3) for p in pictures]
    items = [
        {"image": pictures[0], "top_k": 3},
        {"image": SdkImage(b"junk")},
        {"image": pictures[1], "top_k": 3},
    ]
    batched = instance.predict_batch(Context(), items)
    assert isinstance(batched[1], InputDecodeError)
    for one, many in zip(alone, [batched[0], batched[2]], strict=True):
        assert one.class_ids == many.class_ids
        np.testing.assert_allclose(one.scores, many.scores, atol=1e-5)


def test_zero_shot_scores_the_given_labels(layout, serve) -> None:
    """A CLIP directory scores the request's labels: the same labels back, scores
    summing to 1, highest first."""
    srv = serve(layout("zero-shot-image-classification"))
    labels = ["a cat", "a dog", "a red circle"]
    data = srv.run(image=b64(png()), labels=labels)["data"]
    assert sorted(data["labels"]) == sorted(labels)
    assert data["scores"] == sorted(data["scores"], reverse=True)
    assert abs(sum(data["scores"]) - 1.0) < 1e-4


def test_zero_shot_batch_matches_one_at_a_time(layout) -> None:
    """Two requests with different labels batched give what each gives alone."""
    from mortred_twisted.models.registry import create_model
    from mortred_twisted.sdk import Context

    model = create_model(
        "transformers", {"pretrained": str(layout("zero-shot-image-classification"))}, Path(".")
    )
    items = [
        {"image": SdkImage(png(seed=1)), "labels": ["cat", "dog"], "hypothesis_template": "{}"},
        {"image": SdkImage(png(seed=2)), "labels": ["sun", "dog", "tree"]},
    ]
    batched = model.instance.predict_batch(Context(), items)
    for item, many in zip(items, batched, strict=True):
        one = model.instance.predict(
            Context(), **{"hypothesis_template": "a photo of a {}.", **item}
        )
        assert one.labels == many.labels
        np.testing.assert_allclose(one.scores, many.scores, atol=1e-5)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"labels": []}, "labels"),
        ({"labels": ["cat", "cat"]}, "labels"),
        ({"labels": ["cat"], "hypothesis_template": "no slot"}, "hypothesis_template"),
    ],
)
def test_zero_shot_bad_labels_are_a_422(layout, serve, params, field) -> None:
    """Empty or repeated labels, or a template without {}, answer 422 naming it."""
    srv = serve(layout("zero-shot-image-classification"))
    answer = infer(srv, {"image": b64(png()), **params})
    assert answer.code == 422, answer
    assert field in answer.body.decode()


def test_detector_boxes_lie_in_the_picture(layout, serve) -> None:
    """A DETR directory (transformers ResNet backbone, no timm) returns boxes in the
    picture's pixels; threshold 1 keeps none; a threshold above 1 is a 422."""
    srv = serve(layout("object-detection"))
    data = srv.run(image=b64(png(200, 150)), threshold=0.0, max_detections=4)["data"]
    assert (data["width"], data["height"]) == (200, 150)
    assert 0 < len(data["boxes"]) <= 4
    assert len(data["labels"]) == len(data["scores"]) == len(data["boxes"])
    for x1, y1, x2, y2 in data["boxes"]:
        assert 0 <= x1 <= x2 <= 200 and 0 <= y1 <= y2 <= 150
    assert srv.run(image=b64(png()), threshold=1.0)["data"]["boxes"] == []
    assert srv.submit(image=b64(png()), threshold=1.5).code == 422


def test_segmenter_label_map_is_a_png_of_the_picture(layout, serve) -> None:
    """A SegFormer directory returns a label map PNG of the picture's size whose
    pixels are the listed classes, and their pixel counts."""
    srv = serve(layout("image-segmentation"))
    data = srv.run(image=b64(png(120, 80)))["data"]
    files = srv.files_of(data)
    assert data["label_map"]["content_type"] == "image/png"
    ids = np.asarray(Image.open(io.BytesIO(files[data["label_map"]["name"]])))
    assert ids.shape == (80, 120)
    listed = {entry["id"]: entry["pixels"] for entry in data["labels"]}
    values, counts = np.unique(ids, return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist(), strict=True)) == listed
    assert all(entry["label"] == f"stuff_{entry['id']}" for entry in data["labels"])


def test_depth_is_a_16_bit_png_with_its_range(layout, serve) -> None:
    """A DPT directory returns depth as a 16-bit PNG of the picture's size over
    [min, max]."""
    srv = serve(layout("depth-estimation"))
    data = srv.run(image=b64(png(90, 60)))["data"]
    raw = srv.files_of(data)[data["depth"]["name"]]
    picture = Image.open(io.BytesIO(raw))
    assert picture.mode.startswith("I") and picture.size == (90, 60)
    pixels = np.asarray(picture)
    assert data["min"] <= data["max"]
    if data["max"] > data["min"]:
        assert pixels.min() == 0 and pixels.max() == 65535


def test_openapi_lists_the_task_inputs(layout, serve) -> None:
    """The model's OpenAPI document declares the task's inputs by name."""
    srv = serve(layout("object-detection"))
    answer = srv.request("GET", "/openapi.json")
    assert answer.code == 200, answer
    text = json.dumps(answer.json())
    assert "threshold" in text and "max_detections" in text
