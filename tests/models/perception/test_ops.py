"""Box and mask maths of the perception models against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mortred_twisted.models.box_ops import box_iou, ciou, nms
from mortred_twisted.models.transformers_tasks.sam.amg import (
    build_point_grid,
    masks_to_boxes_xyxy,
    remove_small_regions,
    stability_score,
)
from mortred_twisted.models.transformers_tasks.sam.masks import mask_to_rle, rle_to_mask


def test_box_iou_hand_computed() -> None:
    """Two 2x2 boxes overlapping on a 1x2 strip have IoU 2 / 6."""
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 0.0, 3.0, 2.0], [5.0, 5.0, 6.0, 6.0]])
    iou = box_iou(a, b)
    assert iou[0, 0].item() == pytest.approx(2 / 6)
    assert iou[0, 1].item() == 0.0


def test_ciou_equals_iou_for_identical_centres_and_aspect() -> None:
    """CIoU has no penalty when centres and aspect ratios coincide (so CIoU == IoU)."""
    a = torch.tensor([0.0, 0.0, 4.0, 4.0])
    b = torch.tensor([1.0, 1.0, 3.0, 3.0])
    assert ciou(a, b).item() == pytest.approx(4 / 16, abs=1e-6)


def test_nms_suppresses_only_above_threshold() -> None:
    """NMS keeps the best box, drops a heavy overlap (IoU 0.81) and keeps a light one."""
    boxes = torch.tensor(
        [[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 9.0], [0.0, 0.0, 10.0, 4.0], [20, 20, 30, 30]]
    )
    scores = torch.tensor([0.9, 0.95, 0.8, 0.1])
    # IoU(1, 0) = 90 / 100 = 0.9; IoU(1, 2) = 40 / 90 = 0.444; box 3 is far away.
    assert nms(boxes, scores, 0.5).tolist() == [1, 2, 3]
    assert nms(boxes, scores, 0.4).tolist() == [1, 3]
    assert nms(boxes, scores, 0.95).tolist() == [1, 0, 2, 3]
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).tolist() == []


def test_nms_threshold_is_strict() -> None:
    """A box whose IoU equals the threshold exactly is kept (suppression needs IoU > t)."""
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]])  # IoU 1/3
    assert nms(boxes, torch.tensor([0.9, 0.8]), 1 / 3).tolist() == [0, 1]


def test_stability_score_hand_computed() -> None:
    """Logits with 2 px above +1 and 4 px above -1 have stability 2/4 at offset 1."""
    logits = torch.tensor([[[3.0, 2.0, 0.5, -0.5], [-3.0, -3.0, -3.0, -3.0]]])
    assert stability_score(logits, 0.0, 1.0).tolist() == [pytest.approx(0.5)]
    assert stability_score(torch.full((1, 2, 2), -5.0), 0.0, 1.0).tolist() == [0.0]
    assert stability_score(torch.full((1, 2, 2), 5.0), 0.0, 1.0).tolist() == [1.0]


def test_masks_to_boxes_exclusive_edges() -> None:
    """The box of a mask covering columns 1-2 and row 3 is [1, 3, 3, 4]; empty -> zeros."""
    m = torch.zeros(2, 5, 5, dtype=torch.bool)
    m[0, 3, 1:3] = True
    assert masks_to_boxes_xyxy(m).tolist() == [[1, 3, 3, 4], [0, 0, 0, 0]]


def test_point_grid_cell_centres() -> None:
    """A 2x2 grid sits at the centres of the four quadrants, x varying fastest."""
    assert build_point_grid(2).tolist() == [[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]]


def test_remove_small_regions_holes_and_islands() -> None:
    """A 1 px hole is filled and a 1 px island removed at area 2; big parts stay."""
    m = np.zeros((6, 6), bool)
    m[0:4, 0:4] = True
    m[1, 1] = False  # hole
    m[5, 5] = True  # island
    filled, changed = remove_small_regions(m, 2, "holes")
    assert changed and filled[1, 1]
    cleaned, changed = remove_small_regions(filled, 2, "islands")
    assert changed and not cleaned[5, 5] and cleaned[0:4, 0:4].all()


def test_rle_hand_computed() -> None:
    """RLE counts run column-major and start with the zero run."""
    m = np.array([[0, 1], [0, 1]], bool)
    assert mask_to_rle(m) == {"size": [2, 2], "counts": [2, 2]}
    assert mask_to_rle(np.array([[1, 0]], bool)) == {"size": [1, 2], "counts": [0, 1, 1]}


@settings(max_examples=50, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 12), st.integers(1, 12))))
def test_rle_round_trip(mask: np.ndarray) -> None:
    """Decoding an encoded mask gives it back, and the counts sum to H*W."""
    rle = mask_to_rle(mask)
    assert sum(rle["counts"]) == mask.size
    np.testing.assert_array_equal(rle_to_mask(rle), mask)


def test_mask_boundary_ring() -> None:
    """The boundary of a filled 3x3 square is its ring of 8 pixels."""
    from mortred_twisted.models.transformers_tasks.sam.masks import mask_boundary

    m = np.zeros((5, 5), bool)
    m[1:4, 1:4] = True
    ring = mask_boundary(m)
    assert ring.sum() == 8 and not ring[2, 2] and ring[1, 1]


@settings(max_examples=40, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 10), st.integers(1, 10))))
def test_torch_component_labels_match_scipy(work: np.ndarray) -> None:
    """The SciPy-free labelling finds the same 4-connected components, same numbering."""
    from scipy import ndimage

    from mortred_twisted.models.transformers_tasks.sam.amg import label_components_torch

    expected, n = ndimage.label(work)
    labels, m = label_components_torch(work)
    assert m == n
    np.testing.assert_array_equal(labels, expected)
