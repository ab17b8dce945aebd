"""Crop layers of the automatic mask generator (SAM's ``crop_n_layers``), geometry only.

SAM's generator can run again on overlapping crops of the picture, so that small
objects get an image embedding at a finer scale: layer ``i`` (1-based) splits the
picture into ``2**i x 2**i`` crops that overlap by ``crop_overlap_ratio`` of the
picture's short side scaled by ``2 / 2**i``; layer 0 is the whole picture. Each
crop is embedded once and prompted with its own point grid
(``points_per_side / crop_n_points_downscale_factor**i`` points per side). Masks
whose box touches a crop edge that is not a picture edge (within
:data:`CROP_EDGE_ATOL` px) are cut by the crop and dropped; the rest are moved back
into picture coordinates (:func:`uncrop_boxes`, :func:`uncrop_points`,
:func:`uncrop_masks`), and duplicates across crops are removed by box NMS preferring
the smaller crop (see :mod:`.amg`). This follows the published algorithm of Kirillov
et al. (2023) and the semantics of its reference generator; the code is ours.

Boxes are ``[x1, y1, x2, y2]`` with exclusive ``x2``/``y2`` (a crop box is the slice
``rgb[y1:y2, x1:x2]``).
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import torch

#: Distance (px) under which a mask's box side counts as touching a crop edge (SAM's).
CROP_EDGE_ATOL = 20.0

CropBox = tuple[int, int, int, int]


def generate_crop_boxes(
    width: int, height: int, n_layers: int, overlap_ratio: float
) -> list[tuple[CropBox, int]]:
    """Every crop box with its layer index: ``[((0, 0, width, height), 0), ...]``.

    Layer ``i >= 1`` has ``2**i`` crops per side, each
    ``ceil((overlap * (n - 1) + side) / n)`` px long, where
    ``overlap = int(overlap_ratio * short_side * 2 / n)``, starting every
    ``crop_len - overlap`` px and clipped to the picture; crops are listed with ``x``
    in the outer loop, as SAM lists them. On a picture too small for its layers (a
    crop would start past the picture's edge) a crop's start is clamped so that it
    keeps at least one pixel: every layer keeps its ``4**layer`` crops.
    """
    boxes: list[tuple[CropBox, int]] = [((0, 0, width, height), 0)]
    short_side = min(width, height)
    for layer in range(1, n_layers + 1):
        n = 2**layer
        overlap = int(overlap_ratio * short_side * (2 / n))
        crop_w = math.ceil((overlap * (n - 1) + width) / n)
        crop_h = math.ceil((overlap * (n - 1) + height) / n)
        xs = [min(int((crop_w - overlap) * i), width - 1) for i in range(n)]
        ys = [min(int((crop_h - overlap) * i), height - 1) for i in range(n)]
        for x0, y0 in product(xs, ys):
            boxes.append(((x0, y0, min(x0 + crop_w, width), min(y0 + crop_h, height)), layer))
    return boxes


def crops_per_layer(n_layers: int) -> list[int]:
    """How many crops each layer ``0..n_layers`` has (independent of the picture)."""
    return [4**layer for layer in range(n_layers + 1)]


def points_per_side_of_layer(points_per_side: int, layer: int, downscale_factor: int) -> int:
    """Grid side of a layer's crops: ``int(points_per_side / downscale_factor**layer)``,
    at least 1."""
    return max(1, int(points_per_side / downscale_factor**layer))


def is_box_near_crop_edge(
    boxes: torch.Tensor,
    crop_box: CropBox,
    picture_box: CropBox,
    atol: float = CROP_EDGE_ATOL,
) -> torch.Tensor:
    """Which ``(N, 4)`` boxes (picture coordinates) have a side within ``atol`` of an
    edge of ``crop_box`` that is not also within ``atol`` of the picture's edge."""
    crop = torch.tensor(crop_box, dtype=torch.float32)[None]
    picture = torch.tensor(picture_box, dtype=torch.float32)[None]
    boxes = boxes.float()
    near_crop = torch.isclose(boxes, crop, atol=atol, rtol=0)
    near_picture = torch.isclose(boxes, picture, atol=atol, rtol=0)
    return (near_crop & ~near_picture).any(1)


def uncrop_boxes(boxes: torch.Tensor, crop_box: CropBox) -> torch.Tensor:
    """``(N, 4)`` boxes in crop pixels -> picture pixels."""
    x0, y0 = crop_box[:2]
    return boxes + torch.tensor([x0, y0, x0, y0], dtype=boxes.dtype)


def uncrop_points(points: torch.Tensor, crop_box: CropBox) -> torch.Tensor:
    """``(N, 2)`` points ``(x, y)`` in crop pixels -> picture pixels."""
    return points + torch.tensor(crop_box[:2], dtype=points.dtype)


def uncrop_masks(
    masks: torch.Tensor, crop_box: CropBox, out: torch.Tensor, rows: list[int]
) -> None:
    """Write ``(N, h, w)`` masks of the crop into rows ``rows`` of the picture-sized
    ``out`` ``(M, H, W)``, at the crop's place (the rest of those rows is untouched:
    zeros for a fresh ``out``). In place, so no second picture-sized copy exists."""
    x0, y0, x1, y1 = crop_box
    out[torch.tensor(rows, dtype=torch.long), y0:y1, x0:x1] = masks


def point_grid_in_crop(grid: np.ndarray, crop_box: CropBox) -> np.ndarray:
    """A ``[0, 1]`` point grid ``(P, 2)`` scaled to the crop's pixels (crop coordinates)."""
    x0, y0, x1, y1 = crop_box
    return grid * np.array([x1 - x0, y1 - y0])
