"""Dynamic batching, per-item isolation, progress and cancellation, output formats
(tiny random weights: these behaviours do not depend on training; the transformers
families run on reduced stand-ins of public checkpoints)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InputDecodeError,
    InvalidRequest,
    Model,
    RunCancelled,
    RunContext,
)
from mortred_twisted.models.mortred_v1 import classification as image_classification
from mortred_twisted.models.mortred_v1 import detection as object_detection
from mortred_twisted.models.mortred_v1 import mask_generation as sam_amg
from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig, AutomaticMaskGenerator
from mortred_twisted.models.transformers_tasks.sam.masks import rle_to_mask
from mortred_twisted.models.transformers_tasks.sam.prompter import Embedded
from mortred_twisted.models.yolov8 import family as yolov8
from mortred_twisted.sdk.adapter import SdkModel
from tests.models.perception.conftest import ROOT, png_bytes

RNG = np.random.default_rng(0)
GOOD = png_bytes(RNG.integers(0, 256, (40, 56, 3), dtype=np.uint8))
GOOD2 = png_bytes(RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8))
BAD = b"this is not a picture"


def _req(*images: bytes, **params: object) -> InferenceRequest:
    return InferenceRequest(req_id="t", images=tuple(images), params=dict(params))


def _classifier(stand_in: Callable[[str], Path]) -> SdkModel:
    return image_classification.create({"pretrained": str(stand_in("IMAGE_CLASSIFICATION"))}, ROOT)


def _yolo(tiny_weights: Callable[[str], Path]) -> SdkModel:
    yolov8._SHARED.clear()
    return yolov8.create(
        {
            "model_weights_path": str(tiny_weights("YOLOV8")),
            "model_class_names_path": "conf/model/object_detection/shapes_class_names.txt",
            "model_score_threshold": 0.0,
        },
        ROOT,
    )


def test_classifier_batch_isolates_a_bad_image(stand_in: Callable[[str], Path]) -> None:
    """In one batch, an undecodable image fails alone; its mates get the same scores
    as when run one by one; categories come from the config's id2label."""
    model = _classifier(stand_in)
    reqs = [_req(GOOD), _req(BAD), _req(GOOD2), _req()]
    out = model.run_batch(reqs, [RunContext() for _ in reqs])
    assert isinstance(out[1], InputDecodeError) and isinstance(out[3], InputDecodeError)
    for i in (0, 2):
        single = model.run(reqs[i], RunContext())
        assert out[i]["class_id"] == single["class_id"]
        np.testing.assert_allclose(out[i]["scores"], single["scores"], atol=1e-5)
        assert sum(out[i]["scores"]) == pytest.approx(1.0, abs=1e-3)
        assert len(out[i]["scores"]) == 1001
        assert out[i]["category"] == model.instance.task.parts.config.id2label[out[i]["class_id"]]


def test_classifier_several_images_and_top_k(stand_in: Callable[[str], Path]) -> None:
    """Two images give two results; top_k lists classes by decreasing score."""
    model = _classifier(stand_in)
    req = model.validate(_req(GOOD, GOOD2, top_k=3))
    data = model.run(req, RunContext())
    assert len(data["results"]) == 2
    top = data["results"][0]["top_k"]
    assert [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)
    with pytest.raises(InvalidRequest):
        model.validate(_req(GOOD, top_k=0))


def test_yolo_batch_isolation_and_boxes_inside_picture(
    tiny_weights: Callable[[str], Path],
) -> None:
    """A bad image fails alone; boxes of a 56x40 picture lie inside it; at most top-k."""
    model = _yolo(tiny_weights)
    reqs = [model.validate(_req(GOOD, model_keep_top_k=7)), _req(BAD)]
    out = model.run_batch(reqs, [RunContext(), RunContext()])
    assert isinstance(out[1], InputDecodeError)
    dets = out[0]
    assert 0 < len(dets) <= 7
    for det in dets:
        x1, y1, x2, y2 = det["bbox"]
        assert 0 <= x1 <= x2 <= 56 and 0 <= y1 <= y2 <= 40
        assert det["category"] in ("circle", "rectangle", "triangle")
    assert [d["score"] for d in dets] == sorted((d["score"] for d in dets), reverse=True)


def test_yolo_letterbox_maps_back() -> None:
    """Letterboxing a 100x50 picture scales by 64/100 and pads the bottom."""
    pic, scale = yolov8.letterbox(np.zeros((50, 100, 3), np.uint8), 64)
    assert scale == pytest.approx(0.64)
    assert pic.shape == (64, 64, 3) and (pic[32:] == yolov8.PAD_VALUE).all()


def test_detector_batch_isolation_and_boxes_inside_picture(
    stand_in: Callable[[str], Path],
) -> None:
    """OBJECT_DETECTION: a bad image fails alone; boxes of a 56x40 picture lie inside
    it, sorted by score, at most top-k; labels from id2label; batching gives the
    one-by-one answer."""
    model = object_detection.create(
        {"pretrained": str(stand_in("OBJECT_DETECTION")), "model_score_threshold": 0.0}, ROOT
    )
    reqs = [model.validate(_req(GOOD, model_keep_top_k=7)), _req(BAD), _req(GOOD2)]
    out = model.run_batch(reqs, [RunContext() for _ in reqs])
    assert isinstance(out[1], InputDecodeError)
    dets = out[0]
    assert 0 < len(dets) <= 7
    for det in dets:
        x1, y1, x2, y2 = det["bbox"]
        assert 0 <= x1 <= x2 <= 56 and 0 <= y1 <= y2 <= 40
        assert det["category"] == f"coco_{det['class_id']}"
    assert [d["score"] for d in dets] == sorted((d["score"] for d in dets), reverse=True)
    single = model.run(reqs[2], RunContext())
    assert [d["class_id"] for d in single] == [d["class_id"] for d in out[2]]
    np.testing.assert_allclose([d["bbox"] for d in single], [d["bbox"] for d in out[2]], atol=0.02)
    with pytest.raises(InvalidRequest):
        model.validate(_req(GOOD, model_nms_threshold=1.5))


def _sam(stand_in: Callable[[str], Path], **opts: object) -> SdkModel:
    return sam_amg.create({"pretrained": str(stand_in("SAM_AMG")), **opts}, ROOT)


def test_sam_progress_counts_prompt_batches(stand_in: Callable[[str], Path]) -> None:
    """A 4x4 grid in batches of 5 reports 0..4 of 4 batches, for each of two images."""
    model = _sam(stand_in, points_per_side=4, points_per_batch=5)
    seen: list[tuple[int, int]] = []
    ctx = RunContext(on_progress=lambda s, t: seen.append((s, t)))
    data = model.run(model.validate(_req(GOOD, GOOD2)), ctx)
    assert seen == [(i, 8) for i in range(9)]
    assert len(data["results"]) == 2


def test_sam_cancellation_stops_between_batches(stand_in: Callable[[str], Path]) -> None:
    """Cancelling after the second batch raises RunCancelled before a third starts."""
    model = _sam(stand_in, points_per_side=4, points_per_batch=4)
    seen: list[int] = []
    ctx = RunContext()

    def on_progress(step: int, total: int) -> None:
        seen.append(step)
        if step == 2:
            ctx.cancel()

    ctx._on_progress = on_progress
    with pytest.raises(RunCancelled):
        model.run(model.validate(_req(GOOD)), ctx)
    assert seen == [0, 1, 2]


def test_sam_random_stand_in_gives_well_formed_masks(stand_in: Callable[[str], Path]) -> None:
    """With every filter open, the random SAM stand-in yields masks of the picture's size
    whose records are consistent (area = pixels, bbox inside, one prompt point)."""
    model = _sam(
        stand_in,
        points_per_side=3,
        pred_iou_thresh=0.0,
        stability_score_thresh=0.0,
        stability_score_offset=0.0,
        box_nms_thresh=1.0,
    )
    data = model.run(model.validate(_req(GOOD)), RunContext())
    assert (data["width"], data["height"]) == (56, 40) and data["masks"]
    for record in data["masks"]:
        mask = rle_to_mask(record["segmentation"])
        assert mask.shape == (40, 56) and record["area"] == int(mask.sum()) > 0
        x, y, w, h = record["bbox"]
        assert min(x, y) >= 0 and x + w <= 56 and y + h <= 40
        assert len(record["point_coords"]) == 1


class DiscPrompter:
    """A scripted stand-in for the SAM prompter: two objects (discs) in a 64 px model
    frame; a point inside a disc gets that disc as its first mask (IoU 0.95) and two
    weak masks (IoU 0.5); a point outside gets empty masks (IoU 0.1). Pictures map to
    the model frame as the SAM processor maps them (longest side to 64, pad)."""

    discs = ((20.0, 20.0, 8.0), (44.0, 40.0, 12.0))

    def __init__(self) -> None:
        ys, xs = torch.meshgrid(torch.arange(64.0) + 0.5, torch.arange(64.0) + 0.5, indexing="ij")
        self.masks = [((xs - x) ** 2 + (ys - y) ** 2 <= r * r) for x, y, r in self.discs]

    def embed(self, rgb: np.ndarray) -> Embedded:
        h, w = rgb.shape[:2]
        scale = 64 / max(h, w)
        return Embedded(torch.zeros(1), scale, scale, math.ceil(h * scale), math.ceil(w * scale))

    def predict_points(
        self, embedded: Embedded, points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.full((len(points), 3, 64, 64), -5.0)
        iou = torch.full((len(points), 3), 0.1)
        for i, (px, py) in enumerate((points * embedded.scale_x).tolist()):
            for mask, (x, y, r) in zip(self.masks, self.discs, strict=True):
                if (px - x) ** 2 + (py - y) ** 2 <= r * r:
                    logits[i, 0][mask] = 5.0
                    logits[i, 1, :2, :2] = 5.0
                    iou[i] = torch.tensor([0.95, 0.5, 0.5])
        return logits[:, :, : embedded.valid_h, : embedded.valid_w], iou


def _disc_model(**config: object) -> Model:
    """The served SAM_AMG model (the seed's contract) over the scripted prompter."""
    generator = AutomaticMaskGenerator(DiscPrompter())  # type: ignore[arg-type]
    return sam_amg.serve_generator(generator, AmgConfig(**config))  # type: ignore[arg-type]


def test_amg_filters_and_deduplicates_to_one_mask_per_object() -> None:
    """With a scripted network, the AMG keeps exactly the two discs: weak masks fail
    pred_iou_thresh, empty ones are dropped, duplicates from many points go by NMS."""
    model = _disc_model(points_per_side=8, points_per_batch=10)
    data = model.run(model.validate(_req(GOOD2)), RunContext())
    assert (data["width"], data["height"]) == (64, 64)
    masks = [rle_to_mask(m["segmentation"]) for m in data["masks"]]
    assert len(masks) == 2
    expected = sorted(DiscPrompter().masks, key=lambda m: -int(m.sum()))
    got = sorted(masks, key=lambda m: -int(m.sum()))
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e.numpy())
    for record in data["masks"]:
        _, _, w, h = record["bbox"]
        assert record["area"] > 0 and w > 0 and h > 0
        assert record["predicted_iou"] == pytest.approx(0.95)
        assert record["stability_score"] == 1.0


def test_sam_output_modes_and_overlay() -> None:
    """RLE and PNG segmentations decode to the same masks; the overlay is a PNG of the
    picture's size; a bad image is a decode error; an unknown mode is refused."""
    model = _disc_model(points_per_side=4)
    picture = png_bytes(np.zeros((40, 56, 3), np.uint8))
    rle = model.run(model.validate(_req(picture)), RunContext())
    png = model.run(
        model.validate(_req(picture, output_mode="binary_mask_png", return_overlay=True)),
        RunContext(),
    )
    assert (rle["width"], rle["height"]) == (56, 40)
    assert len(rle["masks"]) == len(png["masks"]) > 0
    for a, b in zip(rle["masks"], png["masks"], strict=True):
        mask = rle_to_mask(a["segmentation"])
        decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(b["segmentation"])))) > 0
        np.testing.assert_array_equal(mask, decoded)
        assert a["area"] == int(mask.sum()) and mask.shape == (40, 56)
    overlay = Image.open(io.BytesIO(base64.b64decode(png["overlay"])))
    assert overlay.size == (56, 40)
    with pytest.raises(InputDecodeError):
        model.run(model.validate(_req(BAD)), RunContext())
    with pytest.raises(InvalidRequest):
        model.validate(_req(picture, output_mode="jpeg"))


def test_amg_large_picture_masks_at_picture_size() -> None:
    """A 320x320 picture is filtered at model resolution; the kept masks come back at
    the picture's size, scaled like the picture (the disc of radius 12 px at model
    scale covers about (12 * 5)^2 * pi px)."""
    model = _disc_model(points_per_side=8)
    data = model.run(
        model.validate(_req(png_bytes(np.zeros((320, 320, 3), np.uint8)))), RunContext()
    )
    assert (data["width"], data["height"]) == (320, 320)
    masks = [rle_to_mask(m["segmentation"]) for m in data["masks"]]
    assert len(masks) == 2 and all(m.shape == (320, 320) for m in masks)
    expected = np.pi * (12 * 5) ** 2
    assert max(int(m.sum()) for m in masks) == pytest.approx(expected, rel=0.05)
