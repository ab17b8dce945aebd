"""The automatic mask generator (SAM's AMG) around a transformers ``SamModel``.

The model is reached through :class:`~.prompter.SamPrompter` (image embedding once,
point prompts in batches through the prompt encoder and mask decoder); the algorithm
is ours. For one image,
for each crop (:mod:`.crops`: the whole picture, plus ``crop_n_layers`` layers of
overlapping crops):

1. preprocess the crop (the ``SamModel``'s image processor: longest side to the
   model's input, padded) and run the image encoder **once**;
2. prompt with the layer's grid of points (cell centres; ``points_per_side`` per
   side, divided by ``crop_n_points_downscale_factor`` per layer),
   ``points_per_batch`` at a time; each point yields ``K`` (3) masks;
3. keep masks whose predicted IoU is ``> pred_iou_thresh`` and whose stability score
   (:func:`stability_score`, offset ``stability_score_offset``) is
   ``> stability_score_thresh``, and whose box does not touch an inner crop edge -
   all on the decoder's low-resolution logits over the crop's area (128 px for the
   shipped model, 256 px for SAM ViT-B/L/H), so the cost does not grow with the
   picture; at most :data:`CANDIDATES_PER_CROP` candidates (highest predicted IoU)
   are held;
4. after every batch: ``progress(batches_done, batches_total)``, then
   ``check_cancelled()``;
5. greedy box NMS within the crop at ``box_nms_thresh``, scored by predicted IoU;
6. with several crops: box NMS across crops at ``crop_nms_thresh``, preferring masks
   of smaller crops;
7. the ``max_masks`` survivors with the highest predicted IoU are resized to their
   crop's size, thresholded at 0 and placed in the picture - the only full-size
   masks ever held, so one image costs at most ``max_masks`` x its pixels;
8. if ``min_mask_region_area > 0``: remove holes and islands smaller than that (pixels)
   from each mask, then NMS again preferring unchanged masks (as SAM does).

Mask records follow SAM: ``segmentation`` (a boolean array here; the serving layer
encodes it), ``area`` (pixels), ``bbox`` ``[x, y, w, h]`` (COCO, pixels),
``predicted_iou``, ``stability_score``, ``point_coords`` ``[[x, y]]`` (picture
pixels), ``crop_box`` ``[x, y, w, h]`` (the crop the mask came from); records are in
decreasing predicted IoU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mortred_twisted.models.box_ops import nms
from mortred_twisted.models.transformers_tasks.sam.crops import (
    CropBox,
    crops_per_layer,
    generate_crop_boxes,
    is_box_near_crop_edge,
    point_grid_in_crop,
    points_per_side_of_layer,
    uncrop_boxes,
    uncrop_masks,
    uncrop_points,
)
from mortred_twisted.models.transformers_tasks.sam.prompter import SamPrompter

#: Upper bound of ``max_masks`` (full-size masks kept per image): with the 1024 x 1024
#: pixel limit of SAM_AMG, 256 masks are 256 MiB of booleans.
MAX_MASKS = 256
#: Candidates (low-resolution logits) held per crop before NMS, highest predicted IoU
#: first: bounds the memory of a grid of 64 x 64 points with every filter open
#: (12,288 candidates) to 1,024 x the low-resolution crop area.
CANDIDATES_PER_CROP = 1024


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
    crop_n_layers: int = 0
    crop_overlap_ratio: float = 512 / 1500
    crop_n_points_downscale_factor: int = 1
    crop_nms_thresh: float = 0.7
    max_masks: int = MAX_MASKS


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


@dataclass
class _CropMasks:
    """One crop's masks after its NMS: low-resolution logits over the crop's area and
    their records' fields, boxes and points in picture coordinates."""

    crop_box: CropBox
    logits: torch.Tensor  # (N, h, w) over the crop
    ious: torch.Tensor
    stabs: torch.Tensor
    points: torch.Tensor  # (N, 2)
    boxes: torch.Tensor  # (N, 4), picture pixels (approximate: from the low-res masks)


def _top_by_iou(ious: torch.Tensor, limit: int) -> torch.Tensor | None:
    """Indices of the ``limit`` highest ``ious`` (stable), or None when within it."""
    if len(ious) <= limit:
        return None
    return torch.sort(ious, descending=True, stable=True).indices[:limit]


class AutomaticMaskGenerator:
    """Runs the AMG with one prompter; thread contract: one call at a time per instance
    (the prompter's model is shared read-only)."""

    def __init__(self, prompter: SamPrompter) -> None:
        self.prompter = prompter

    def batches(self, config: AmgConfig) -> int:
        """Number of prompt batches one image takes (the progress total per image):
        the same for every picture size."""
        total = 0
        for layer, crops in enumerate(crops_per_layer(config.crop_n_layers)):
            side = points_per_side_of_layer(
                config.points_per_side, layer, config.crop_n_points_downscale_factor
            )
            total += crops * -(-(side**2) // config.points_per_batch)
        return total

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
        crops = [
            self._process_crop(rgb, box, layer, config, on_batch)
            for box, layer in generate_crop_boxes(
                w, h, config.crop_n_layers, config.crop_overlap_ratio
            )
        ]
        index = [(c, i) for c in range(len(crops)) for i in range(len(crops[c].ious))]
        if not index:
            return []
        if len(crops) > 1:
            # Duplicates across crops: the mask of the smaller crop wins (SAM scores
            # them 1 / crop area), then the higher predicted IoU.
            boxes = torch.cat([c.boxes for c in crops])
            ious = torch.cat([c.ious for c in crops])
            areas = torch.tensor(
                [
                    float((b[2] - b[0]) * (b[3] - b[1]))
                    for b in (crops[c].crop_box for c, _ in index)
                ]
            )
            rank = np.lexsort((-ious.numpy(), areas.numpy()))
            scores = torch.empty(len(index))
            scores[torch.from_numpy(rank)] = -torch.arange(len(index), dtype=torch.float32)
            kept = nms(boxes, scores, config.crop_nms_thresh)
            index = [index[i] for i in kept.tolist()]
        ious = torch.stack([crops[c].ious[i] for c, i in index])
        order = torch.sort(ious, descending=True, stable=True).indices[: config.max_masks]
        index = [index[i] for i in order.tolist()]
        # The only full-size masks: written in place, chunk by chunk, never copied
        # (records hold views of rows of this one tensor).
        masks = torch.zeros((len(index), h, w), dtype=torch.bool)
        for c, crop in enumerate(crops):
            rows = [r for r, (cc, _) in enumerate(index) if cc == c]
            for start in range(0, len(rows), 16):
                chunk = rows[start : start + 16]
                picked = crop.logits[torch.tensor([index[r][1] for r in chunk])]
                uncrop_masks(
                    self._upscale(picked, crop.crop_box, config), crop.crop_box, masks, chunk
                )
        ious = torch.stack([crops[c].ious[i] for c, i in index])
        stabs = torch.stack([crops[c].stabs[i] for c, i in index])
        pts_all = torch.stack([crops[c].points[i] for c, i in index])
        crop_boxes = [crops[c].crop_box for c, _ in index]
        rows_kept = torch.nonzero(masks.flatten(1).any(1)).flatten()
        if config.min_mask_region_area > 0 and len(rows_kept):
            rows_kept = self._postprocess_small_regions(masks, ious, rows_kept, config)
        boxes = masks_to_boxes_xyxy(masks)
        records = []
        for r in rows_kept.tolist():
            m, (x1, y1, x2, y2), p, cb = (
                masks[r],
                boxes[r].int().tolist(),
                pts_all[r],
                crop_boxes[r],
            )
            records.append(
                {
                    "segmentation": m.numpy(),
                    "area": int(m.sum()),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "predicted_iou": round(float(ious[r]), 6),
                    "stability_score": round(float(stabs[r]), 6),
                    "point_coords": [[round(float(p[0]), 2), round(float(p[1]), 2)]],
                    "crop_box": [cb[0], cb[1], cb[2] - cb[0], cb[3] - cb[1]],
                }
            )
        return records

    def _process_crop(
        self,
        rgb: np.ndarray,
        crop_box: CropBox,
        layer: int,
        config: AmgConfig,
        on_batch: Callable[[], None] | None,
    ) -> _CropMasks:
        """Embed one crop once, prompt its grid in batches, filter, NMS within it."""
        x0, y0, x1, y1 = crop_box
        h, w = rgb.shape[:2]
        crop = np.ascontiguousarray(rgb[y0:y1, x0:x1])
        embedded = self.prompter.embed(crop)
        to_crop = torch.tensor(
            [(x1 - x0) / embedded.valid_w, (y1 - y0) / embedded.valid_h] * 2
        )  # low-res px -> crop px
        side = points_per_side_of_layer(
            config.points_per_side, layer, config.crop_n_points_downscale_factor
        )
        points = point_grid_in_crop(build_point_grid(side), crop_box)
        logits_all = torch.zeros(0, embedded.valid_h, embedded.valid_w)
        iou_all, stab_all = torch.zeros(0), torch.zeros(0)
        pts_all, boxes_all = torch.zeros(0, 2), torch.zeros(0, 4)
        for start in range(0, len(points), config.points_per_batch):
            pts = torch.from_numpy(points[start : start + config.points_per_batch]).float()
            logits, iou = self.prompter.predict_points(embedded, pts)
            k = logits.shape[1]
            # Filters run on the low-resolution logits over the crop's area, so a
            # large picture costs no more than a small one until the survivors are
            # resized; IoU-based NMS is unchanged by the (near) uniform scale.
            logits = logits.flatten(0, 1)
            iou = iou.flatten()
            stab = stability_score(logits, config.mask_threshold, config.stability_score_offset)
            keep = (iou > config.pred_iou_thresh) & (stab > config.stability_score_thresh)
            keep &= (logits > config.mask_threshold).flatten(1).any(1)
            logits, iou, stab = logits[keep], iou[keep], stab[keep]
            pts_rep = pts.repeat_interleave(k, 0)[keep]
            boxes = uncrop_boxes(
                masks_to_boxes_xyxy(logits > config.mask_threshold) * to_crop, crop_box
            )
            inside = ~is_box_near_crop_edge(boxes, crop_box, (0, 0, w, h))
            logits_all = torch.cat([logits_all, logits[inside]])
            iou_all = torch.cat([iou_all, iou[inside]])
            stab_all = torch.cat([stab_all, stab[inside]])
            pts_all = torch.cat([pts_all, uncrop_points(pts_rep[inside], crop_box)])
            boxes_all = torch.cat([boxes_all, boxes[inside]])
            top = _top_by_iou(iou_all, CANDIDATES_PER_CROP)
            if top is not None:
                logits_all, iou_all, stab_all = logits_all[top], iou_all[top], stab_all[top]
                pts_all, boxes_all = pts_all[top], boxes_all[top]
            if on_batch is not None:
                on_batch()
        order = nms(boxes_all, iou_all, config.box_nms_thresh)[: config.max_masks]
        return _CropMasks(
            crop_box,
            logits_all[order],
            iou_all[order],
            stab_all[order],
            pts_all[order],
            boxes_all[order],
        )

    @staticmethod
    def _upscale(logits: torch.Tensor, crop_box: CropBox, config: AmgConfig) -> torch.Tensor:
        """Low-resolution logits ``(N, h, w)`` -> boolean masks at the crop's size (the
        caller passes at most 16 at a time: the float intermediate is 4 bytes a pixel)."""
        x0, y0, x1, y1 = crop_box
        size = (y1 - y0, x1 - x0)
        if tuple(logits.shape[1:]) == size:
            return logits > config.mask_threshold
        return torch.cat(
            [
                F.interpolate(chunk[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
                > config.mask_threshold
                for chunk in logits.split(16)
            ]
        )

    @staticmethod
    def _postprocess_small_regions(
        masks: torch.Tensor, ious: torch.Tensor, rows: torch.Tensor, config: AmgConfig
    ) -> torch.Tensor:
        """Clean the masks of ``rows`` in place (no second full-size copy), then NMS
        preferring the unchanged masks; the surviving rows in decreasing predicted IoU."""
        unchanged = []
        array = masks.numpy()
        for j in rows.tolist():
            m, holes = remove_small_regions(array[j], config.min_mask_region_area, "holes")
            m, islands = remove_small_regions(m, config.min_mask_region_area, "islands")
            array[j] = m
            unchanged.append(0.0 if (holes or islands) else 1.0)
        boxes = masks_to_boxes_xyxy(masks)[rows]
        nonempty = torch.stack([masks[j].any() for j in rows.tolist()])
        scores = torch.tensor(unchanged)
        scores[~nonempty] = -1.0
        order = nms(boxes, scores, config.box_nms_thresh)
        order = order[nonempty[order]]
        order = order[torch.argsort(-ious[rows[order]], stable=True)]
        return rows[order]
