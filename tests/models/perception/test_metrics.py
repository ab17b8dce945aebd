"""Evaluation maths (AP, best-match IoU) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from training.perception.metrics import average_precision, detection_map, mask_matching


def test_perfect_detections_give_map_one() -> None:
    """Ground truth echoed as detections scores mAP 1 at every IoU threshold."""
    gt = [(np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([0, 1]))]
    det = [(gt[0][0], np.array([0.9, 0.8]), gt[0][1])]
    out = detection_map(det, gt, 2)
    assert out["map50"] == pytest.approx(1.0)
    assert out["map50_95"] == pytest.approx(1.0)


def test_ap_half_recall() -> None:
    """One hit out of two ground truths (precision 1) gives AP 51/101 (101-point)."""
    ap = average_precision(np.array([True]), np.array([0.9]), 2)
    assert ap == pytest.approx(51 / 101)


def test_false_positive_ranked_first_lowers_ap() -> None:
    """A false positive above the single hit halves precision: AP 0.5."""
    ap = average_precision(np.array([False, True]), np.array([0.9, 0.8]), 1)
    assert ap == pytest.approx(0.5)


def test_mask_matching_best_iou() -> None:
    """Each ground-truth mask takes the best IoU over predictions; missing ones get 0."""
    gt = np.zeros((2, 4, 4), bool)
    gt[0, :2, :2] = True
    gt[1, 2:, 2:] = True
    pred = np.zeros((1, 4, 4), bool)
    pred[0, :2, :1] = True  # half of gt 0
    assert mask_matching(pred, gt).tolist() == [0.5, 0.0]
