"""The automatic mask generator (SAM's AMG) around a transformers ``SamModel``.

The model is reached through :class:`~.prompter.SamPrompter` (image embedding once,
point prompts in batches through the prompt encoder and mask decoder) or, for our own
segmenter, :class:`~.prompter.NetworkPrompter`; the algorithm is ours. One crop (the
whole picture), for one image:

1. preprocess the picture (a ``SamModel``'s image processor: longest side to the
   model's input, padded; our segmenter: letterbox) and run the image encoder **once**;
2. prompt with a ``points_per_side`` x ``points_per_side`` grid of points (cell
   centres), ``points_per_batch`` at a time; each point yields ``K`` (3) masks;
3. keep masks whose predicted IoU is ``> pred_iou_thresh`` and whose stability score
   (:func:`stability_score`, offset ``stability_score_offset``) is
   ``> stability_score_thresh`` - both on the decoder's low-resolution logits over the
   picture's area (64 px for the shipped model, 256 px for SAM ViT-B/L/H), so the cost
   does not grow with the picture;
4. after every batch: ``progress(batches_done, batches_total)``, then
   ``check_cancelled()``;
5. greedy box NMS over the masks' boxes at ``box_nms_thresh``, scored by predicted IoU;
   the survivors' logits are resized to the picture's size and thresholded at 0;
6. if ``min_mask_region_area > 0``: remove holes and islands smaller than that (pixels)
   from each mask, then NMS again preferring unchanged masks (as SAM does).

Mask records follow SAM: ``segmentation`` (a boolean array here; the serving layer
encodes it), ``area`` (pixels), ``bbox`` ``[x, y, w, h]`` (COCO, pixels),
``predicted_iou``, ``stability_score``, ``point_coords`` ``[[x, y]]`` (picture pixels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mortred_twisted.models.detection.ops import nms
from mortred_twisted.models.segment_anything.prompter import NetworkPrompter, SamPrompter


@dataclass(frozen=True)
class AmgConfig:
    """The C++ config keys of the automatic mask generator (SAM's names and meaning)."""

    points_per_side: int = 16
    points_per_batch: int = 64
    pred_iou_thresh: float = 0.88
    stability_score_thresh: float = 0.95
    stability_score_offset: float = 1.0
    box_nms_thresh: float = 0.7
    min_mask_region_area: int = 0
    mask_threshold: float = 0.0


def build_point_grid(n: int) -> np.ndarray:
    """``(n*n, 2)`` cell-centre points ``(x, y)`` in ``[0, 1]``, x varying fastest."""
    offset = 1.0 / (2 * n)
    side = np.linspace(offset, 1 - offset, n)
    xs = np.tile(side[None, :], (n, 1))
    ys = np.tile(side[:, None], (1, n))
    return np.stack([xs, ys], -1).reshape(-1, 2)


def stability_score(logits: torch.Tensor, threshold: float, offset: float) -> torch.Tensor:
    """IoU between the masks thresholded at ``threshold + offset`` and at
    ``threshold - offset`` (SAM's stability score), over the last two axes.

    The high mask is contained in the low one, so this is ``|high| / |low|``; an
    empty low mask scores 0.
    """
    high = (logits > threshold + offset).flatten(-2).sum(-1, dtype=torch.int64)
    low = (logits > threshold - offset).flatten(-2).sum(-1, dtype=torch.int64)
    return torch.where(
        low > 0, high / low.clamp(min=1), torch.zeros_like(high, dtype=torch.float64)
    ).float()


def masks_to_boxes_xyxy(masks: torch.Tensor) -> torch.Tensor:
    """Tight ``[x1, y1, x2, y2]`` (exclusive x2/y2) of ``(N, H, W)`` boolean masks;
    empty masks give ``[0, 0, 0, 0]``."""
    if masks.numel() == 0:
        return torch.zeros(0, 4)
    n, h, w = masks.shape
    cols, rows = masks.any(1), masks.any(2)
    xs = torch.arange(w).expand(n, w)
    ys = torch.arange(h).expand(n, h)
    x1 = torch.where(cols, xs, w).amin(1)
    x2 = torch.where(cols, xs, -1).amax(1) + 1
    y1 = torch.where(rows, ys, h).amin(1)
    y2 = torch.where(rows, ys, -1).amax(1) + 1
    boxes = torch.stack([x1, y1, x2, y2], 1).float()
    return torch.where(cols.any(1)[:, None], boxes, torch.zeros_like(boxes))


def label_components_torch(work: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected components of a boolean picture by label propagation (each pixel
    takes the largest label among itself and its 4 neighbours until nothing changes);
    labels ``1..n`` in order of first appearance (row-major), 0 outside."""
    mask = torch.from_numpy(np.ascontiguousarray(work, dtype=bool))
    h, w = mask.shape
    labels = torch.arange(1, h * w + 1, dtype=torch.int64).reshape(h, w) * mask
    while True:
        p = F.pad(labels, (1, 1, 1, 1))
        spread = (
            torch.stack([labels, p[:-2, 1:-1], p[2:, 1:-1], p[1:-1, :-2], p[1:-1, 2:]]).amax(0)
            * mask
        )
        if torch.equal(spread, labels):
            break
        labels = spread
    flat = labels.reshape(-1).numpy()
    uniq, first = np.unique(flat[flat > 0], return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    lut = np.zeros(h * w + 1, dtype=np.int64)
    lut[order] = np.arange(1, len(order) + 1)
    return lut[flat].reshape(h, w), len(order)


def label_components(work: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected components (``scipy.ndimage.label`` when SciPy is installed, else
    :func:`label_components_torch`; both number components in row-major order)."""
    try:
        from scipy import ndimage
    except ImportError:
        return label_components_torch(work)
    labels, n = ndimage.label(work)
    return labels, int(n)


def remove_small_regions(mask: np.ndarray, area_thresh: int, mode: str) -> tuple[np.ndarray, bool]:
    """Remove ``holes`` or ``islands`` smaller than ``area_thresh`` px; ``(mask, changed)``."""
    correct_holes = mode == "holes"
    work = (~mask if correct_holes else mask).astype(bool)
    labels, n = label_components(work)
    if n == 0:
        return mask, False
    sizes = np.bincount(labels.ravel())[1:]
    small = np.flatnonzero(sizes < area_thresh) + 1
    if small.size == 0:
        return mask, False
    if correct_holes:
        fill = np.isin(labels, small)
        return mask | fill, True
    keep = [i + 1 for i in range(n) if i + 1 not in set(small.tolist())]
    if not keep:  # keep the largest island rather than nothing
        keep = [int(np.argmax(sizes)) + 1]
    return np.isin(labels, keep), True


class AutomaticMaskGenerator:
    """Runs the AMG with one prompter; thread contract: one call at a time per instance
    (the prompter's model is shared read-only)."""

    def __init__(self, prompter: SamPrompter | NetworkPrompter) -> None:
        self.prompter = prompter

    def batches(self, config: AmgConfig) -> int:
        """Number of prompt batches one image takes (the progress total per image)."""
        n = config.points_per_side**2
        return -(-n // config.points_per_batch)

    @torch.inference_mode()
    def generate(
        self,
        rgb: np.ndarray,
        config: AmgConfig,
        on_batch: Callable[[], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Mask records for the picture ``rgb`` ``(H, W, 3)`` uint8 (see module doc).

        ``on_batch`` is called after each prompt batch (progress + cancellation hook;
        it may raise to stop the run).
        """
        h, w = rgb.shape[:2]
        embedded = self.prompter.embed(rgb)
        valid_h, valid_w = embedded.valid_h, embedded.valid_w
        points = build_point_grid(config.points_per_side) * np.array([w, h])
        kept_logits: list[torch.Tensor] = []
        kept_iou: list[torch.Tensor] = []
        kept_stab: list[torch.Tensor] = []
        kept_pts: list[torch.Tensor] = []
        for start in range(0, len(points), config.points_per_batch):
            pts = torch.from_numpy(points[start : start + config.points_per_batch]).float()
            logits, iou = self.prompter.predict_points(embedded, pts)
            k = logits.shape[1]
            # Filters run on the low-resolution logits over the picture's area, so a
            # large picture costs no more than a small one until the survivors are
            # resized; IoU-based NMS is unchanged by the (near) uniform scale.
            logits = logits.flatten(0, 1)
            iou = iou.flatten()
            pts_rep = pts.repeat_interleave(k, 0)
            stab = stability_score(logits, config.mask_threshold, config.stability_score_offset)
            keep = (iou > config.pred_iou_thresh) & (stab > config.stability_score_thresh)
            keep &= (logits > config.mask_threshold).flatten(1).any(1)
            kept_logits.append(logits[keep])
            kept_iou.append(iou[keep])
            kept_stab.append(stab[keep])
            kept_pts.append(pts_rep[keep])
            if on_batch is not None:
                on_batch()
        low = torch.cat(kept_logits)
        if not len(low):
            return []
        ious, stabs, pts_all = torch.cat(kept_iou), torch.cat(kept_stab), torch.cat(kept_pts)
        order = nms(masks_to_boxes_xyxy(low > config.mask_threshold), ious, config.box_nms_thresh)
        low, ious, stabs, pts_all = low[order], ious[order], stabs[order], pts_all[order]
        if (valid_h, valid_w) != (h, w):
            masks = torch.cat(
                [
                    F.interpolate(
                        chunk[:, None], size=(h, w), mode="bilinear", align_corners=False
                    )[:, 0]
                    > config.mask_threshold
                    for chunk in low.split(16)
                ]
            )
        else:
            masks = low > config.mask_threshold
        nonempty = masks.flatten(1).any(1)
        masks, ious, stabs, pts_all = (
            masks[nonempty],
            ious[nonempty],
            stabs[nonempty],
            pts_all[nonempty],
        )
        if config.min_mask_region_area > 0 and len(masks):
            masks, ious, stabs, pts_all = self._postprocess_small_regions(
                masks, ious, stabs, pts_all, config
            )
        boxes = masks_to_boxes_xyxy(masks)
        records = []
        for m, b, i, s, p in zip(masks, boxes, ious, stabs, pts_all, strict=True):
            x1, y1, x2, y2 = (int(v) for v in b.tolist())
            records.append(
                {
                    "segmentation": m.numpy(),
                    "area": int(m.sum()),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "predicted_iou": round(float(i), 6),
                    "stability_score": round(float(s), 6),
                    "point_coords": [[round(float(p[0]), 2), round(float(p[1]), 2)]],
                }
            )
        return records

    @staticmethod
    def _postprocess_small_regions(
        masks: torch.Tensor,
        ious: torch.Tensor,
        stabs: torch.Tensor,
        pts: torch.Tensor,
        config: AmgConfig,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cleaned, unchanged = [], []
        for m in masks.numpy():
            m, holes = remove_small_regions(m, config.min_mask_region_area, "holes")
            m, islands = remove_small_regions(m, config.min_mask_region_area, "islands")
            cleaned.append(m)
            unchanged.append(0.0 if (holes or islands) else 1.0)
        new = torch.from_numpy(np.stack(cleaned))
        nonempty = new.flatten(1).any(1)
        new, ious, stabs, pts = new[nonempty], ious[nonempty], stabs[nonempty], pts[nonempty]
        scores = torch.tensor(unchanged)[nonempty]
        order = nms(masks_to_boxes_xyxy(new), scores, config.box_nms_thresh)
        order = order[torch.argsort(-ious[order], stable=True)]
        return new[order], ious[order], stabs[order], pts[order]
