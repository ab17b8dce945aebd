"""The strict text-to-image judge: how well is the named shape drawn, not only which is nearest.

Pure numpy + Pillow (no torch): a measuring instrument for ``eval_txt2img`` next to the
CNN judge (``judge.py``). The CNN gives any blob its nearest class; this judge fits the
renderer's own geometry (:func:`mortred_twisted.data.captions.shape_mask`, the very
rasteriser call the training pictures were drawn with) to the picture and fails a
shape that is not drawn well enough.

One picture, ``(H, W, 3)`` uint8 (as served) or float in ``[-1, 1]``:

1. **Background** = the per-channel median of the one-pixel border (the shape covers
   at most a few border pixels: its extent is at most 44 % of the side, jitter 2 px).
2. **Shape pixels**: candidates are pixels farther than :data:`MIN_CONTRAST` (L1)
   from the background; the shape's colour is the median of the clearly-shape ones
   (at least half the 95th-percentile distance, so blurred edges do not pull it); each
   pixel is then projected on the background→shape colour line and the **mask** is
   the pixels past half way (``alpha >= 0.5``). Fewer than :data:`MIN_AREA` pixels:
   no shape (shape, colour and place fail).
3. **Colour / background**: the nearest palette colour (L1), and it must lie within
   :data:`COLOUR_TOLERANCE` of it. That is under half the distance between the two
   closest palette colours (about 190), so a pass is never ambiguous, and above the
   renderer's jitter (at most 36) plus room for a decoder's error.
4. **Shape fit**: for each of the three shapes, the centre and radius that maximise the
   IoU of the ideal mask with the found mask (a start from the mask's moments, then a
   coarse-to-fine grid of centre and radius). The fitted class is the one with the best
   IoU. **Convexity** = ``|mask| / |mask ∪ raster(convex hull of the mask's pixel
   centres)|`` (1.0 for any rasterised convex shape, about 0.6 for a pinched star).
   The shape passes when the fitted class is the named one, its IoU is at least
   :data:`MIN_IOU` and the convexity at least :data:`MIN_CONVEXITY`.
5. **Place**: the best-fitting shape's centre must be nearest to the named place's
   centre and within :data:`PLACE_TOLERANCE` pixels of it (jitter is 2 px per axis),
   and the fit must cover at least :data:`MIN_BLOB_IOU` of the mask (scattered pixels,
   as in noise, have no place).

Why these measures: the IoU against the ideal mask of the named shape at the found
place and size is what a person checks ("is that a square?") and is exact on the
renderer's pictures (it fits its own rasteriser); a disc fitted as a square, a drop
fitted as a circle or a pinched star fitted as a square all lose 10–40 IoU points,
far more than the renderer's pictures (IoU 1.0) or a faithful reconstruction.
Convexity names the failure "concave sides" on its own. Thresholds are constants,
chosen from the measurements in ``docs/models/diffusion.md``; the tests pin the
verdicts they must give.

Thread/ownership: functions are pure; nothing is cached across calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from mortred_twisted.data.captions import (
    COLOUR_NAMES,
    COLOURS,
    POSITIONS,
    SHAPES,
    SQUARE_HALF_SIDE,
    place_centre,
    shape_mask,
)

MIN_CONTRAST = 60.0  # L1 from the background for a candidate shape pixel
MIN_AREA = 12  # pixels: fewer is "no shape"
COLOUR_TOLERANCE = 90.0  # L1 to the nearest palette colour
MIN_IOU = 0.88
MIN_CONVEXITY = 0.9
MAX_DEVIATION = 2.0  # px: no pixel farther than this outside (or inside) the ideal outline
PLACE_TOLERANCE = 4.0  # px from the named place's centre
MIN_BLOB_IOU = 0.5  # a place is read only for a blob that some ideal shape covers half of
REASONS = ("no shape", "wrong class", "low IoU", "concave", "outline off")
STRICT_ATTRIBUTES = ("shape", "colour", "position", "background")

_PALETTE = np.array([COLOURS[name] for name in COLOUR_NAMES], dtype=np.float64)
# area of the ideal shape over r**2: circle pi, square (2 * 0.85)**2, triangle 1.9 * 1.75 / 2
_AREA_PER_R2 = (np.pi, (2 * SQUARE_HALF_SIDE) ** 2, 1.9 * 1.75 / 2)
# the ideal shape's centroid is (cx, cy + offset * r): the triangle's lies below its centre
_CENTROID_OFFSET = (0.0, 0.0, (-1.0 + 0.75 + 0.75) / 3)


@dataclass(frozen=True)
class ShapeFit:
    """The best placement of one ideal shape on a mask."""

    iou: float
    cx: float
    cy: float
    r: float
    deviation: float = 0.0  # px, see :func:`deviation`


@dataclass(frozen=True)
class Verdict:
    """What the strict judge read in one picture.

    ``shape``/``colour``/``position``/``background`` are indices into
    ``captions.ATTRIBUTES`` or -1 when the judge reads none (no shape, a colour out
    of tolerance, a place too far from every centre). ``fits`` has one
    :class:`ShapeFit` per shape (empty when there is no shape).
    """

    shape: int
    colour: int
    position: int
    background: int
    fits: tuple[ShapeFit, ...]
    convexity: float
    area: int

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.shape, self.colour, self.position, self.background)


def to_uint8(picture: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` uint8 from uint8 or float in ``[-1, 1]`` (``(3, H, W)`` accepted)."""
    a = np.asarray(picture)
    if a.ndim != 3:
        raise ValueError(f"a picture is (H, W, 3) or (3, H, W), not {a.shape}")
    if a.shape[0] == 3 and a.shape[2] != 3:
        a = a.transpose(1, 2, 0)
    if a.shape[2] != 3:
        raise ValueError(f"a picture has 3 channels, not {a.shape}")
    if a.dtype != np.uint8:
        a = np.clip(np.round((a.astype(np.float64) + 1.0) * 127.5), 0, 255).astype(np.uint8)
    return a


def _nearest_colour(rgb: np.ndarray) -> int:
    dist = np.abs(_PALETTE - rgb).sum(1)
    best = int(dist.argmin())
    return best if dist[best] <= COLOUR_TOLERANCE else -1


def _border(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a[0], a[-1], a[1:-1, 0], a[1:-1, -1]])


def shape_and_colours(picture: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(mask, background rgb, shape rgb or None)`` of a uint8 ``(H, W, 3)`` picture."""
    a = picture.astype(np.float64)
    bg = np.median(_border(a), axis=0)
    dist = np.abs(a - bg).sum(2)
    candidates = dist > MIN_CONTRAST
    if candidates.sum() < MIN_AREA:
        return np.zeros(dist.shape, bool), bg, None
    strong = candidates & (dist >= 0.5 * np.percentile(dist[candidates], 95))
    fg = np.median(a[strong], axis=0)
    axis = fg - bg
    alpha = ((a - bg) @ axis) / max(float(axis @ axis), 1e-9)
    return alpha >= 0.5, bg, fg


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return np.count_nonzero(a & b) / union if union else 0.0


def fit_shape(mask: np.ndarray, shape: int) -> ShapeFit:
    """The ideal ``shape`` placement with the best IoU on ``mask`` (coarse-to-fine grid)."""
    size = mask.shape[0]
    ys, xs = np.nonzero(mask)
    area = len(xs)
    r0 = float(np.sqrt(area / _AREA_PER_R2[shape]))
    cx0 = float(xs.mean()) + 0.5
    cy0 = float(ys.mean()) + 0.5 - _CENTROID_OFFSET[shape] * r0
    best = ShapeFit(_iou(mask, shape_mask(shape, cx0, cy0, r0, size)), cx0, cy0, r0)
    for step, rstep in ((0.5, 0.06), (0.25, 0.03), (0.125, 0.015)):
        centre = best
        for dx in (-2, -1, 0, 1, 2):
            for dy in (-2, -1, 0, 1, 2):
                for dr in (-2, -1, 0, 1, 2):
                    cx = centre.cx + dx * step
                    cy = centre.cy + dy * step
                    r = centre.r * (1.0 + dr * rstep)
                    iou = _iou(mask, shape_mask(shape, cx, cy, r, size))
                    if iou > best.iou:
                        best = ShapeFit(iou, cx, cy, r)
    ideal = shape_mask(shape, best.cx, best.cy, best.r, size)
    return ShapeFit(best.iou, best.cx, best.cy, best.r, deviation(mask, ideal))


def deviation(mask: np.ndarray, ideal: np.ndarray) -> float:
    """The farthest a pixel of ``mask`` lies outside ``ideal`` or a hole lies inside it, in px.

    Each pixel of the symmetric difference is measured to the nearest pixel of the
    region it should have been: an extra pixel to the ideal shape, a missing one to
    the outside. Rasterisation gives at most 1 px; a drop's point, a pinched side or
    a stray blob give more.
    """
    size = mask.shape
    yy, xx = np.mgrid[0 : size[0], 0 : size[1]]
    worst = 0.0
    for wrong, target in ((mask & ~ideal, ideal), (ideal & ~mask, ~ideal)):
        if not wrong.any() or not target.any():
            continue
        p = np.stack([xx[wrong], yy[wrong]], 1).astype(np.float64)
        q = np.stack([xx[target], yy[target]], 1).astype(np.float64)
        d = np.sqrt(((p[:, None, :] - q[None, :, :]) ** 2).sum(2)).min(1)
        worst = max(worst, float(d.max()))
    return worst


def _hull(points: np.ndarray) -> list[tuple[float, float]]:
    """Convex hull (Andrew's monotone chain) of ``(N, 2)`` points, counter-clockwise."""
    pts = sorted({(float(x), float(y)) for x, y in points})
    if len(pts) < 3:
        return pts

    def cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[tuple[float, float]] = []
    upper: list[tuple[float, float]] = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return lower[:-1] + upper[:-1]


def convexity(mask: np.ndarray) -> float:
    """``|mask| / |mask ∪ raster(hull of its pixel centres)|``: 1.0 for a convex raster."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return 0.0
    hull = _hull(np.stack([xs, ys], 1))
    canvas = Image.new("L", (mask.shape[1], mask.shape[0]), 0)
    if len(hull) >= 3:
        ImageDraw.Draw(canvas).polygon(hull, fill=255, outline=255)
    filled = (np.asarray(canvas) > 0) | mask
    return len(xs) / int(np.count_nonzero(filled))


def _place(cx: float, cy: float, size: int) -> int:
    dist = [np.hypot(cx - px, cy - py) for px, py in (place_centre(p, size) for p in range(5))]
    best = int(np.argmin(dist))
    return best if dist[best] <= PLACE_TOLERANCE else -1


def read_picture(picture: np.ndarray) -> Verdict:
    """The strict judge's reading of one picture (see the module docstring)."""
    a = to_uint8(picture)
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"the judge reads square pictures, not {a.shape[:2]}")
    mask, bg, fg = shape_and_colours(a)
    background = _nearest_colour(bg)
    if fg is None:
        return Verdict(-1, -1, -1, background, (), 0.0, 0)
    fits = tuple(fit_shape(mask, s) for s in range(len(SHAPES)))
    best = max(range(len(SHAPES)), key=lambda s: fits[s].iou)
    conv = convexity(mask)
    good = (
        fits[best].iou >= MIN_IOU
        and conv >= MIN_CONVEXITY
        and fits[best].deviation <= MAX_DEVIATION
    )
    shape = best if good else -1
    fit = fits[best]
    return Verdict(
        shape=shape,
        colour=_nearest_colour(fg),
        position=_place(fit.cx, fit.cy, a.shape[0]) if fit.iou >= MIN_BLOB_IOU else -1,
        background=background,
        fits=fits,
        convexity=conv,
        area=int(mask.sum()),
    )


def why_shape_failed(verdict: Verdict, named: int) -> str | None:
    """``None`` if the named shape passed, else one of :data:`REASONS`."""
    if not verdict.fits:
        return "no shape"
    best = max(range(len(SHAPES)), key=lambda s: verdict.fits[s].iou)
    if best != named:
        return "wrong class"
    if verdict.fits[named].iou < MIN_IOU:
        return "low IoU"
    if verdict.convexity < MIN_CONVEXITY:
        return "concave"
    if verdict.fits[named].deviation > MAX_DEVIATION:
        return "outline off"
    return None


def judge_pictures(pictures: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Per-attribute pass rates (and ``all_four``, mean named-shape IoU, fail reasons).

    ``pictures``: ``(N, H, W, 3)`` uint8 or ``(N, 3, H, W)`` float in ``[-1, 1]``;
    ``labels``: ``(N, 4)`` indices (shape, colour, position, background).
    """
    labels = np.asarray(labels)
    if len(pictures) != len(labels) or len(labels) == 0:
        raise ValueError("one label row per picture, at least one picture")
    hits = np.zeros((len(labels), 4), bool)
    ious = []
    reasons = dict.fromkeys(REASONS, 0)
    for i, (picture, named) in enumerate(zip(pictures, labels, strict=True)):
        verdict = read_picture(picture)
        hits[i] = np.asarray(verdict.as_tuple()) == named
        ious.append(verdict.fits[named[0]].iou if verdict.fits else 0.0)
        reason = why_shape_failed(verdict, int(named[0]))
        if reason is not None:
            reasons[reason] += 1
    row = {name: round(float(hits[:, i].mean()), 4) for i, name in enumerate(STRICT_ATTRIBUTES)}
    row["all_four"] = round(float(hits.all(1).mean()), 4)
    row["shape_iou"] = round(float(np.mean(ious)), 4)
    for reason, count in reasons.items():
        row[f"fail: {reason}"] = round(count / len(labels), 4)
    return row


__all__ = [
    "POSITIONS",
    "ShapeFit",
    "Verdict",
    "convexity",
    "fit_shape",
    "judge_pictures",
    "read_picture",
    "shape_and_colours",
    "why_shape_failed",
]
