"""Seeded synthetic scenes for the perception models (numpy + Pillow, no torch).

A scene is a small RGB picture (64 px by default) of one to five flat-coloured shapes
(:data:`CLASS_NAMES`: circle, rectangle, triangle) at random positions, sizes, colours
and rotations on a noisy background. Later shapes occlude earlier ones. Each instance
carries its exact *visible* mask (pixel-exact: shapes are rasterised without
anti-aliasing and the same raster paints the picture), its tight box and its label.

Contracts:

* :func:`make_scene` is a pure function of its ``numpy.random.Generator``: the same
  generator state gives the same scene on every machine (Pillow's rasteriser is
  deterministic).
* Every instance is at least :data:`MIN_VISIBLE_AREA` pixels and at least
  :data:`MIN_VISIBLE_FRACTION` of its full shape is visible; no two instances share a
  colour closer than :data:`MIN_COLOUR_DISTANCE`, so instances are separable by eye.
* :func:`scene_split` gives fixed ``train`` / ``val`` splits: each split has its own
  seed (``SPLIT_SEEDS``), so the splits never share a scene.

Boxes are ``[x1, y1, x2, y2]`` in pixels with exclusive right/bottom edges
(``x2 = last column + 1``), the convention every perception model here reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

CLASS_NAMES: tuple[str, ...] = ("circle", "rectangle", "triangle")
SPLIT_SEEDS: dict[str, int] = {"train": 20261130, "val": 20261131, "demo": 7}
MIN_VISIBLE_AREA = 24
MIN_VISIBLE_FRACTION = 0.5
MIN_COLOUR_DISTANCE = 90


@dataclass(frozen=True)
class Scene:
    """One picture and its instances (N may be zero only if asked for)."""

    image: np.ndarray  # (H, W, 3) uint8
    masks: np.ndarray  # (N, H, W) bool, visible part of each instance
    boxes: np.ndarray  # (N, 4) float32, [x1, y1, x2, y2], exclusive x2/y2
    labels: np.ndarray  # (N,) int64 into CLASS_NAMES

    @property
    def size(self) -> int:
        return int(self.image.shape[0])


def _colour(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, size=3).astype(np.int64)


def _far_from(colour: np.ndarray, others: list[np.ndarray]) -> bool:
    return all(int(np.abs(colour - o).sum()) >= MIN_COLOUR_DISTANCE for o in others)


def _shape_mask(rng: np.random.Generator, label: int, size: int, extent: float) -> np.ndarray:
    """Rasterise one shape of class ``label`` with diameter about ``extent`` px."""
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    cx = rng.uniform(extent / 2 - 2, size - extent / 2 + 2)
    cy = rng.uniform(extent / 2 - 2, size - extent / 2 + 2)
    r = extent / 2
    if label == 0:  # circle
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif label == 1:  # rectangle, aspect 0.6..1, random rotation
        aspect = rng.uniform(0.6, 1.0)
        hw, hh = r * 0.9, r * 0.9 * aspect
        theta = rng.uniform(0, math.pi)
        corners = [(-hw, -hh), (hw, -hh), (hw, hh), (-hw, hh)]
        pts = [
            (
                cx + x * math.cos(theta) - y * math.sin(theta),
                cy + x * math.sin(theta) + y * math.cos(theta),
            )
            for x, y in corners
        ]
        draw.polygon(pts, fill=255)
    else:  # triangle: equilateral-ish, random rotation
        theta = rng.uniform(0, 2 * math.pi)
        pts = [
            (
                cx + r * math.cos(theta + k * 2 * math.pi / 3),
                cy + r * math.sin(theta + k * 2 * math.pi / 3),
            )
            for k in range(3)
        ]
        draw.polygon(pts, fill=255)
    return np.asarray(canvas) > 0


def make_scene(
    rng: np.random.Generator,
    size: int = 64,
    min_objects: int = 1,
    max_objects: int = 5,
    min_extent: float | None = None,
    max_extent: float | None = None,
) -> Scene:
    """Draw one scene from ``rng`` (see the module docstring for the guarantees)."""
    min_extent = size * 0.17 if min_extent is None else min_extent
    max_extent = size * 0.45 if max_extent is None else max_extent
    bg = _colour(rng)
    n_target = int(rng.integers(min_objects, max_objects + 1))
    full: list[np.ndarray] = []
    colours: list[np.ndarray] = []
    labels: list[int] = []
    visible: list[np.ndarray] = []
    attempts = 0
    while len(full) < n_target and attempts < 50:
        attempts += 1
        label = int(rng.integers(0, len(CLASS_NAMES)))
        mask = _shape_mask(rng, label, size, rng.uniform(min_extent, max_extent))
        colour = _colour(rng)
        if not _far_from(colour, [bg, *colours]) or mask.sum() < MIN_VISIBLE_AREA:
            continue
        new_visible = [v & ~mask for v in visible]
        if any(
            nv.sum() < max(MIN_VISIBLE_AREA, MIN_VISIBLE_FRACTION * f.sum())
            for nv, f in zip(new_visible, full, strict=True)
        ):
            continue  # would hide too much of an earlier instance
        visible = [*new_visible, mask]
        full.append(mask)
        colours.append(colour)
        labels.append(label)
    image = np.empty((size, size, 3), dtype=np.float32)
    image[:] = bg
    for mask, colour in zip(full, colours, strict=True):
        image[mask] = colour
    image += rng.normal(0.0, 6.0, size=image.shape)
    image_u8 = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    masks = np.stack(visible) if visible else np.zeros((0, size, size), dtype=bool)
    boxes = np.stack([mask_to_box(m) for m in masks]) if visible else np.zeros((0, 4))
    return Scene(
        image=image_u8,
        masks=masks,
        boxes=boxes.astype(np.float32),
        labels=np.asarray(labels, dtype=np.int64),
    )


def mask_to_box(mask: np.ndarray) -> np.ndarray:
    """Tight ``[x1, y1, x2, y2]`` (exclusive x2/y2) of a non-empty boolean mask."""
    ys, xs = np.nonzero(mask)
    if xs.size == 0:
        return np.zeros(4, dtype=np.float32)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)


@lru_cache(maxsize=8)
def _split_cached(split: str, n: int, size: int) -> tuple[Scene, ...]:
    seed = SPLIT_SEEDS.get(split)
    if seed is None:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLIT_SEEDS)}")
    rng = np.random.default_rng([seed, size])
    return tuple(make_scene(rng, size=size) for _ in range(n))


def scene_split(split: str, n: int, size: int = 64) -> list[Scene]:
    """The first ``n`` scenes of the fixed split ``train``, ``val`` or ``demo``.

    Scene ``i`` of a split does not depend on ``n`` (a longer split extends a shorter
    one), so evaluations on a prefix stay comparable.
    """
    return list(_split_cached(split, n, size))


def render_digit_canvas(
    digit: np.ndarray,
    rng: np.random.Generator,
    canvas: int,
    scale: tuple[float, float] = (0.8, 1.2),
    noise: float = 0.1,
) -> np.ndarray:
    """Place a ``[0, 1]`` digit picture, rescaled, at a random spot of a larger canvas.

    Used for the robustness evaluation of the digit classifier: the digit (side ``d``)
    is scaled by a factor from ``scale`` (clipped so that it fits), pasted at a uniformly
    random offset on a dark ``canvas`` x ``canvas`` picture, and Gaussian noise of
    standard deviation ``noise`` is added. Returns ``float32`` in ``[0, 1]``.
    """
    d = digit.shape[0]
    side = int(round(min(canvas, d * rng.uniform(*scale))))  # noqa: RUF046 - numpy scalars
    pil = Image.fromarray(digit.astype(np.float32), mode="F").resize((side, side), Image.BILINEAR)
    out = np.zeros((canvas, canvas), dtype=np.float32)
    y0 = int(rng.integers(0, canvas - side + 1))
    x0 = int(rng.integers(0, canvas - side + 1))
    out[y0 : y0 + side, x0 : x0 + side] = np.asarray(pil)
    out += rng.normal(0.0, noise, size=out.shape).astype(np.float32)
    return np.clip(out, 0.0, 1.0)
