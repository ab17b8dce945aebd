"""Evaluation maths for the perception models (numpy only).

* :func:`average_precision` / :func:`detection_map`: COCO-style AP (101-point
  interpolated precision envelope), greedy matching of detections in decreasing score
  order to unmatched ground truth of the same class at IoU >= t; mAP is the mean over
  classes that have ground truth, and mAP@0.5:0.95 the mean over t = 0.50..0.95 step 0.05.
* :func:`mask_matching`: for every ground-truth instance, the best IoU of any predicted
  mask ("best-match IoU"); recall@0.5 is the share of instances with best IoU >= 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def box_iou_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU ``(N, M)`` of ``[x1, y1, x2, y2]`` boxes."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(-1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def average_precision(tp: np.ndarray, scores: np.ndarray, n_gt: int) -> float:
    """COCO 101-point AP of detections flagged ``tp`` (bool) with ``scores``."""
    if n_gt == 0:
        return float("nan")
    if len(tp) == 0:
        return 0.0
    order = np.argsort(-scores, kind="stable")
    tp = tp[order].astype(np.float64)
    ctp, cfp = np.cumsum(tp), np.cumsum(1 - tp)
    recall = ctp / n_gt
    precision = ctp / np.maximum(ctp + cfp, 1e-9)
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    points = np.linspace(0, 1, 101)
    idx = np.searchsorted(recall, points, side="left")
    return float(np.mean([envelope[i] if i < len(envelope) else 0.0 for i in idx]))


def detection_map(
    detections: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    ground_truth: Sequence[tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    thresholds: Sequence[float] = tuple(np.arange(0.5, 0.96, 0.05)),
) -> dict[str, float]:
    """``detections[i] = (boxes, scores, labels)``, ``ground_truth[i] = (boxes, labels)``.

    Returns ``{"map50", "map50_95"}`` plus per-threshold means under ``"map@t"``.
    """
    per_t: dict[float, list[float]] = {}
    for t in thresholds:
        aps = []
        for c in range(num_classes):
            tps, scs, n_gt = [], [], 0
            for (db, ds, dl), (gb, gl) in zip(detections, ground_truth, strict=True):
                d_idx, g_idx = np.flatnonzero(dl == c), np.flatnonzero(gl == c)
                n_gt += len(g_idx)
                if len(d_idx) == 0:
                    continue
                order = d_idx[np.argsort(-ds[d_idx], kind="stable")]
                iou = box_iou_np(db[order], gb[g_idx])
                used = np.zeros(len(g_idx), dtype=bool)
                for row in range(len(order)):
                    hit = False
                    if len(g_idx):
                        cand = np.where(used, -1.0, iou[row])
                        j = int(np.argmax(cand))
                        if cand[j] >= t:
                            used[j] = hit = True
                    tps.append(hit)
                    scs.append(ds[order[row]])
            ap = average_precision(np.array(tps, bool), np.array(scs), n_gt)
            if not np.isnan(ap):
                aps.append(ap)
        per_t[round(float(t), 2)] = float(np.mean(aps)) if aps else 0.0
    out = {"map50": per_t.get(0.5, float("nan")), "map50_95": float(np.mean(list(per_t.values())))}
    out.update({f"map@{t:.2f}": v for t, v in per_t.items()})
    return out


def mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU ``(N, M)`` of boolean masks ``(N, H, W)`` and ``(M, H, W)``."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    fa = a.reshape(len(a), -1).astype(np.float32)
    fb = b.reshape(len(b), -1).astype(np.float32)
    inter = fa @ fb.T
    union = fa.sum(1)[:, None] + fb.sum(1)[None, :] - inter
    return inter / np.maximum(union, 1e-9)


def mask_matching(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Best IoU of any predicted mask for each ground-truth mask, shape ``(M,)``."""
    if len(gt) == 0:
        return np.zeros(0)
    if len(pred) == 0:
        return np.zeros(len(gt))
    return mask_iou(gt, pred).max(1)
