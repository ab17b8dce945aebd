"""Mask encodings of the mask generator's outputs (numpy only; no torch).

* :func:`mask_to_rle` / :func:`rle_to_mask`: COCO's uncompressed RLE as SAM emits
  it, ``{"size": [H, W], "counts": [n0, n1, ...]}``: run lengths of the mask read in
  column-major (Fortran) order, starting with a run of zeros (possibly 0);
* :func:`overlay`: the picture with each mask tinted and outlined (largest first).

Pure functions; any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO uncompressed RLE of a boolean ``(H, W)`` mask (column-major runs)."""
    h, w = mask.shape
    flat = mask.T.reshape(-1).astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        counts = [0, *counts]
    return {"size": [int(h), int(w)], "counts": [int(c) for c in counts]}


def rle_to_mask(rle: Mapping[str, Any]) -> np.ndarray:
    """Inverse of :func:`mask_to_rle`."""
    h, w = rle["size"]
    flat = np.zeros(h * w, dtype=bool)
    pos, value = 0, False
    for count in rle["counts"]:
        flat[pos : pos + count] = value
        pos += count
        value = not value
    return flat.reshape(w, h).T


PALETTE = np.array(
    [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [210, 245, 60],
        [250, 190, 212],
    ],
    dtype=np.float32,
)


def mask_boundary(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` with a 4-neighbour outside it (or on the picture's edge)."""
    padded = np.pad(mask, 1, constant_values=False)
    inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~inner


def overlay(rgb: np.ndarray, masks: Sequence[np.ndarray], alpha: float = 0.5) -> np.ndarray:
    """The picture with each mask tinted a palette colour and outlined in it (largest
    first, so small masks stay visible on top)."""
    out = rgb.astype(np.float32).copy()
    order = sorted(range(len(masks)), key=lambda i: -int(masks[i].sum()))
    for rank, i in enumerate(order):
        colour = PALETTE[rank % len(PALETTE)]
        m = masks[i]
        out[m] = (1 - alpha) * out[m] + alpha * colour
        out[mask_boundary(m)] = colour
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
