"""Crop layers of the automatic mask generator and the bounds on what one request may
cost (scripted prompters: these behaviours do not depend on a trained network)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InvalidRequest,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.models.mortred_v1 import mask_generation as sam_amg
from mortred_twisted.models.transformers_tasks.sam.amg import (
    CANDIDATES_PER_CROP,
    MAX_MASKS,
    AmgConfig,
    AutomaticMaskGenerator,
)
from mortred_twisted.models.transformers_tasks.sam.crops import (
    generate_crop_boxes,
    is_box_near_crop_edge,
    points_per_side_of_layer,
    uncrop_boxes,
    uncrop_masks,
    uncrop_points,
)
from mortred_twisted.models.transformers_tasks.sam.masks import rle_to_mask
from mortred_twisted.models.transformers_tasks.sam.prompter import Embedded
from tests.models.perception.conftest import ROOT, png_bytes


def test_crop_boxes_match_hand_computed_layers() -> None:
    """A 100x60 picture, 2 layers, overlap 0.25: layer 1 has 2x2 crops of 58x38 px
    every 43/23 px (overlap int(0.25 * 60) = 15), layer 2 has 4x4 crops of 31x21 px
    every 24/14 px (overlap int(7.5) = 7), clipped to the picture, x outermost."""
    boxes = generate_crop_boxes(100, 60, 2, 0.25)
    assert boxes[0] == ((0, 0, 100, 60), 0)
    assert boxes[1:5] == [
        ((0, 0, 58, 38), 1),
        ((0, 23, 58, 60), 1),
        ((43, 0, 100, 38), 1),
        ((43, 23, 100, 60), 1),
    ]
    layer2 = [b for b, layer in boxes if layer == 2]
    expected = [
        (x, y, min(x + 31, 100), min(y + 21, 60)) for x in (0, 24, 48, 72) for y in (0, 14, 28, 42)
    ]
    assert layer2 == expected and len(boxes) == 1 + 4 + 16


def test_crop_boxes_of_a_tiny_picture_stay_inside_it() -> None:
    """On a 3x2 picture every one of the 1 + 4 + 16 crops keeps at least one pixel."""
    boxes = generate_crop_boxes(3, 2, 2, 512 / 1500)
    assert len(boxes) == 21
    for (x0, y0, x1, y1), _ in boxes:
        assert 0 <= x0 < x1 <= 3 and 0 <= y0 < y1 <= 2


def test_points_per_layer_downscale() -> None:
    """points_per_side 32 with factor 2 gives 32, 16, 8 points per side; never 0."""
    assert [points_per_side_of_layer(32, i, 2) for i in range(3)] == [32, 16, 8]
    assert points_per_side_of_layer(2, 3, 4) == 1


def test_uncrop_boxes_points_and_masks() -> None:
    """Crop coordinates move by the crop's origin; a crop mask lands at its place in
    its row of the picture-sized masks, with zeros elsewhere and other rows untouched."""
    crop = (10, 20, 14, 23)
    box = uncrop_boxes(torch.tensor([[1.0, 0.0, 3.0, 2.0]]), crop)
    assert box.tolist() == [[11.0, 20.0, 13.0, 22.0]]
    assert uncrop_points(torch.tensor([[0.5, 1.5]]), crop).tolist() == [[10.5, 21.5]]
    mask = torch.zeros(1, 3, 4, dtype=torch.bool)
    mask[0, 1, 2] = True
    full = torch.zeros(2, 30, 40, dtype=torch.bool)
    uncrop_masks(mask, crop, full, [1])
    assert full[0].sum() == 0 and full[1].sum() == 1 and bool(full[1, 21, 12])


def test_box_near_crop_edge_ignores_picture_edges() -> None:
    """A box touching the crop's inner right edge is cut (dropped); one touching a
    crop edge that is also the picture's edge is not; one well inside is kept."""
    crop, picture = (0, 0, 100, 100), (0, 0, 200, 200)
    boxes = torch.tensor(
        [
            [40.0, 40.0, 95.0, 60.0],  # 5 px from the crop's inner right edge
            [0.0, 0.0, 30.0, 30.0],  # on the crop's left/top edges = the picture's
            [40.0, 40.0, 60.0, 60.0],  # inside
        ]
    )
    assert is_box_near_crop_edge(boxes, crop, picture).tolist() == [True, False, False]


class ColourPrompter:
    """A scripted prompter that segments by colour: the embedding is the crop itself;
    a point's first mask is every pixel of the crop with the point's colour (IoU 0.95
    for a coloured pixel, 0.1 for black), at the crop's own resolution."""

    def __init__(self) -> None:
        self.embedded_shapes: list[tuple[int, int]] = []

    def embed(self, rgb: np.ndarray) -> Embedded:
        self.embedded_shapes.append(rgb.shape[:2])
        h, w = rgb.shape[:2]
        return Embedded(torch.from_numpy(rgb.copy()), 1.0, 1.0, h, w)

    def predict_points(
        self, embedded: Embedded, points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        crop = embedded.embeddings
        h, w = crop.shape[:2]
        logits = torch.full((len(points), 3, h, w), -5.0)
        iou = torch.full((len(points), 3), 0.1)
        for i, (x, y) in enumerate(points.tolist()):
            colour = crop[min(int(y), h - 1), min(int(x), w - 1)]
            if int(colour.sum()) > 0:
                logits[i, 0][(crop == colour).all(-1)] = 5.0
                iou[i, 0] = 0.95
        return logits, iou


RECTS = {  # colour -> (x0, y0, x1, y1) in a 300 x 300 picture
    (255, 0, 0): (130, 130, 170, 170),
    (0, 255, 0): (30, 40, 60, 70),
    (0, 0, 255): (200, 230, 290, 280),
}


def _rect_picture() -> np.ndarray:
    rgb = np.zeros((300, 300, 3), np.uint8)
    for colour, (x0, y0, x1, y1) in RECTS.items():
        rgb[y0:y1, x0:x1] = colour
    return rgb


def _colour_model(**config: object) -> tuple[Model, ColourPrompter]:
    """The served SAM_AMG model (the seed's contract) over the scripted prompter."""
    prompter = ColourPrompter()
    generator = AutomaticMaskGenerator(prompter)  # type: ignore[arg-type]
    return sam_amg.serve_generator(generator, AmgConfig(**config)), prompter  # type: ignore[arg-type]


def _req(image: bytes, **params: object) -> InferenceRequest:
    return InferenceRequest(req_id="t", images=(image,), params=dict(params))


def test_two_crop_layers_give_each_object_once_in_picture_coordinates() -> None:
    """With 2 crop layers (21 crops, each embedded once) every rectangle comes back
    exactly once, at its place in the 300 x 300 picture, from the smallest crop that
    holds it whole; progress counts every crop's batches."""
    model, prompter = _colour_model(
        points_per_side=8,
        points_per_batch=16,
        pred_iou_thresh=0.5,
        stability_score_thresh=0.5,
        crop_n_layers=2,
    )
    seen: list[tuple[int, int]] = []
    ctx = RunContext(on_progress=lambda s, t: seen.append((s, t)))
    data = model.run(model.validate(_req(png_bytes(_rect_picture()))), ctx)
    assert len(prompter.embedded_shapes) == 21
    assert seen[-1] == (21 * 4, 21 * 4) and len(seen) == 21 * 4 + 1
    masks = data["masks"]
    assert len(masks) == len(RECTS)
    found = {}
    for record in masks:
        mask = rle_to_mask(record["segmentation"])
        assert mask.shape == (300, 300) and record["area"] == int(mask.sum())
        x, y, w, h = record["bbox"]
        found[(x, y, x + w, y + h)] = record
        ys, xs = np.nonzero(mask)
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)
        px, py = record["point_coords"][0]
        assert x <= px <= x + w and y <= py <= y + h
        cx, cy, cw, ch = record["crop_box"]
        assert cx <= x and cy <= y and x + w <= cx + cw and y + h <= cy + ch
    assert sorted(found) == sorted(RECTS.values())
    # The centre square sits whole in a layer-1 crop (201 px) but within 20 px of every
    # layer-2 crop edge around it: it comes from layer 1, not the whole picture.
    assert found[(130, 130, 170, 170)]["crop_box"][2] < 300


def test_crop_layers_cancel_between_batches() -> None:
    """Cancelling inside the second crop stops the run before another batch runs."""
    model, prompter = _colour_model(points_per_side=4, points_per_batch=8, crop_n_layers=1)
    steps: list[int] = []
    ctx = RunContext()

    def on_progress(step: int, total: int) -> None:
        steps.append(step)
        if step == 3:
            ctx.cancel()

    ctx._on_progress = on_progress
    with pytest.raises(Exception, match="cancel"):
        model.run(model.validate(_req(png_bytes(_rect_picture()))), ctx)
    assert steps == [0, 1, 2, 3] and len(prompter.embedded_shapes) == 2


@pytest.mark.parametrize(
    "params",
    [
        {"crop_n_layers": 4},
        {"crop_n_layers": -1},
        {"crop_overlap_ratio": 0.95},
        {"crop_n_points_downscale_factor": 0},
        {"crop_nms_thresh": 1.5},
        {"max_masks": 0},
        {"max_masks": MAX_MASKS + 1},
        {"points_per_batch": 257},
        {"points_per_side": 65},
    ],
)
def test_out_of_range_params_are_refused(params: dict[str, object]) -> None:
    """Crop and cap params outside their bounds are an invalid request (422)."""
    model, _ = _colour_model()
    with pytest.raises(InvalidRequest):
        model.validate(_req(png_bytes(_rect_picture()), **params))


def test_out_of_range_config_is_a_load_error() -> None:
    """A model config may not set what a request may not (same ranges)."""
    with pytest.raises(ModelLoadError, match="max_masks"):
        sam_amg.amg_config_from_options({"max_masks": 10_000})
    with pytest.raises(ModelLoadError, match="crop_n_layers"):
        sam_amg.amg_config_from_options({"crop_n_layers": 9})


def test_max_masks_keeps_the_highest_predicted_iou() -> None:
    """max_masks = 2 returns the two masks with the highest predicted IoU."""
    model, _ = _colour_model(points_per_side=16, pred_iou_thresh=0.0, stability_score_thresh=0.0)
    everything = model.run(model.validate(_req(png_bytes(_rect_picture()))), RunContext())
    capped = model.run(model.validate(_req(png_bytes(_rect_picture()), max_masks=2)), RunContext())
    assert len(everything["masks"]) > 2 and len(capped["masks"]) == 2
    assert [m["predicted_iou"] for m in capped["masks"]] == [
        m["predicted_iou"] for m in everything["masks"][:2]
    ]


WORST_CASE = """
import json, resource, sys
import numpy as np, torch
sys.path.insert(0, {root!r})
from mortred_twisted.model_api.base import InferenceRequest, RunContext
from mortred_twisted.models.mortred_v1 import mask_generation as sam_amg
from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig, AutomaticMaskGenerator
from mortred_twisted.models.transformers_tasks.sam.prompter import Embedded
from tests.models.perception.conftest import png_bytes

class EveryPointAMask:
    # 64 px low-res masks (the shipped model's size): each point's three masks are
    # distinct squares around it, all passing every filter.
    def embed(self, rgb):
        h, w = rgb.shape[:2]
        s = 64 / max(h, w)
        return Embedded(torch.zeros(1), s, s, max(1, round(h * s)), max(1, round(w * s)))
    def predict_points(self, embedded, points):
        n = len(points)
        logits = torch.full((n, 3, embedded.valid_h, embedded.valid_w), -5.0)
        for i, (x, y) in enumerate((points * embedded.scale_x).long().tolist()):
            for k in range(3):
                logits[i, k, max(0, y - k - 1): y + k + 2, max(0, x - k - 1): x + k + 2] = 5.0
        return logits, torch.rand(n, 3) * 0.5 + 0.5

params = json.loads(sys.argv[1])
model = sam_amg.serve_generator(AutomaticMaskGenerator(EveryPointAMask()), AmgConfig())
rgb = (np.random.default_rng(0).integers(0, 256, (1024, 1024, 3))).astype(np.uint8)
request = model.validate(InferenceRequest("t", (png_bytes(rgb),), params))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data = model.run(request, RunContext())
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"masks": len(data["masks"]), "delta_mib": (after - before) / 1024}}))
"""


@pytest.mark.slow
def test_worst_case_params_stay_within_the_request_budget() -> None:
    """The most expensive params a request may send (64 x 64 points, every filter open,
    no NMS, the most masks, small-region cleanup) on a 1024 x 1024 picture cost less
    than 1 GiB above the loaded model: at most MAX_MASKS full-size masks and
    CANDIDATES_PER_CROP low-resolution candidates are ever held."""
    worst = {
        "points_per_side": 64,
        "points_per_batch": 256,
        "pred_iou_thresh": 0.0,
        "stability_score_thresh": 0.0,
        "stability_score_offset": 0.0,
        "box_nms_thresh": 1.0,
        "min_mask_region_area": 4,
        "max_masks": MAX_MASKS,
        "return_overlay": True,
    }
    out = subprocess.run(
        [sys.executable, "-c", WORST_CASE.format(root=str(ROOT)), json.dumps(worst)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["masks"] == MAX_MASKS
    assert CANDIDATES_PER_CROP * 64 * 64 * 4 < 2**30 / 8
    assert figures["delta_mib"] < 1024, figures
    print(f"worst-case request: {figures}")
