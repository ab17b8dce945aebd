"""Seeded captioned pictures for the text-to-image model (numpy + Pillow, no torch).

A picture is a small RGB image (32 px by default) of one flat-coloured shape
(:data:`SHAPES`) of one colour (:data:`COLOURS`) at one of five places
(:data:`POSITIONS`) on a plain background of another colour, with the caption that
says so: ``"a red circle in the top left on a blue background"``. Each picture carries
its four attribute labels (indices into :data:`ATTRIBUTES`' value tuples), which is
what the judge classifier predicts and what the text-to-image evaluation checks.

Contracts:

* :func:`make_captioned` is a pure function of its ``numpy.random.Generator``: the same
  generator state gives the same picture and caption on every machine (Pillow's
  rasteriser is deterministic; shapes are drawn without anti-aliasing).
* The shape's colour is never the background's; every colour pair is at least
  :data:`MIN_COLOUR_DISTANCE` apart (L1, before jitter), so both are readable by eye.
* The shape stays inside its place: its centre is within :data:`JITTER_PX` pixels of
  the place's centre (a quadrant's centre, or the picture's), its extent between
  :data:`EXTENT_RANGE` of the picture's side.
* :func:`caption_split` gives fixed splits (``train``: the generator's data, ``judge``:
  the judge's, ``eval``: the evaluation's prompts and reference pictures); each split
  has its own seed (:data:`SPLIT_SEEDS`), and picture ``i`` of a split does not depend
  on how many are asked for.
* :func:`parse_caption` inverts :func:`caption_text` (``ValueError`` on any other text).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 215, 40),
    "purple": (140, 50, 180),
    "white": (240, 240, 240),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
POSITIONS: tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right", "center")
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "shape": SHAPES,
    "colour": COLOUR_NAMES,
    "position": POSITIONS,
    "background": COLOUR_NAMES,
}
SPLIT_SEEDS: dict[str, int] = {"train": 20261203, "judge": 20261204, "eval": 20261205}
MIN_COLOUR_DISTANCE = 150
COLOUR_JITTER = 12
JITTER_PX = 2.0
EXTENT_RANGE = (0.34, 0.44)
SQUARE_HALF_SIDE = 0.85  # a square's half side over the circle's radius


@dataclass(frozen=True)
class Attributes:
    """One picture's content as indices into :data:`ATTRIBUTES`' value tuples."""

    shape: int
    colour: int
    position: int
    background: int

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.shape, self.colour, self.position, self.background)


def caption_text(attrs: Attributes) -> str:
    """The caption of ``attrs``: ``"a <colour> <shape> in the <position> on a <bg> background"``."""
    return (
        f"a {COLOUR_NAMES[attrs.colour]} {SHAPES[attrs.shape]} in the "
        f"{POSITIONS[attrs.position]} on a {COLOUR_NAMES[attrs.background]} background"
    )


def parse_caption(text: str) -> Attributes:
    """The attributes named by a caption made by :func:`caption_text` (``ValueError`` else)."""
    words = text.strip().lower().split()
    try:
        if words[0] != "a" or words[3:5] != ["in", "the"] or words[-1] != "background":
            raise ValueError
        rest = " ".join(words[5:-1])
        place, _, bg = rest.rpartition(" on a ")
        return Attributes(
            shape=SHAPES.index(words[2]),
            colour=COLOUR_NAMES.index(words[1]),
            position=POSITIONS.index(place),
            background=COLOUR_NAMES.index(bg),
        )
    except (IndexError, ValueError):
        raise ValueError(f"not a caption of mortred_twisted.data.captions: {text!r}") from None


def caption_words() -> list[str]:
    """Every word any caption uses, sorted (the text-to-image tokenizer's vocabulary)."""
    words = {"a", "in", "the", "on", "background", *SHAPES, *COLOUR_NAMES}
    for place in POSITIONS:
        words.update(place.split())
    return sorted(words)


def _far_enough(a: str, b: str) -> bool:
    return sum(abs(x - y) for x, y in zip(COLOURS[a], COLOURS[b], strict=True)) >= (
        MIN_COLOUR_DISTANCE
    )


ALLOWED_PAIRS: tuple[tuple[int, int], ...] = tuple(
    (c, b)
    for c in range(len(COLOUR_NAMES))
    for b in range(len(COLOUR_NAMES))
    if c != b and _far_enough(COLOUR_NAMES[c], COLOUR_NAMES[b])
)


def sample_attributes(rng: np.random.Generator) -> Attributes:
    """Uniform over shapes, places and the allowed (colour, background) pairs."""
    shape = int(rng.integers(0, len(SHAPES)))
    position = int(rng.integers(0, len(POSITIONS)))
    colour, background = ALLOWED_PAIRS[int(rng.integers(0, len(ALLOWED_PAIRS)))]
    return Attributes(shape=shape, colour=colour, position=position, background=background)


def place_centre(position: int, size: int = 32) -> tuple[float, float]:
    """The centre ``(x, y)`` in pixels of place ``position`` (before jitter)."""
    q = size / 4.0
    return {
        0: (q, q),
        1: (3 * q, q),
        2: (q, 3 * q),
        3: (3 * q, 3 * q),
        4: (2 * q, 2 * q),
    }[position]


def _jittered(rgb: tuple[int, int, int], rng: np.random.Generator) -> tuple[int, int, int]:
    out = np.clip(np.asarray(rgb) + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, 3), 0, 255)
    return (int(out[0]), int(out[1]), int(out[2]))


def render(attrs: Attributes, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """Draw ``attrs`` as a ``(size, size, 3)`` uint8 picture (jitter drawn from ``rng``)."""
    bg = _jittered(COLOURS[COLOUR_NAMES[attrs.background]], rng)
    fg = _jittered(COLOURS[COLOUR_NAMES[attrs.colour]], rng)
    cx, cy = place_centre(attrs.position, size)
    cx += rng.uniform(-JITTER_PX, JITTER_PX)
    cy += rng.uniform(-JITTER_PX, JITTER_PX)
    r = rng.uniform(*EXTENT_RANGE) * size / 2.0
    canvas = Image.new("RGB", (size, size), bg)
    _draw_shape(ImageDraw.Draw(canvas), attrs.shape, cx, cy, r, fg)
    return np.asarray(canvas, dtype=np.uint8).copy()


def _draw_shape(
    draw: ImageDraw.ImageDraw, shape: int, cx: float, cy: float, r: float, fill: object
) -> None:
    if shape == 0:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == 1:
        h = r * SQUARE_HALF_SIDE  # a square of the circle's area, about
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    else:  # upright triangle, apex up
        draw.polygon(
            [(cx, cy - r), (cx + r * 0.95, cy + r * 0.75), (cx - r * 0.95, cy + r * 0.75)],
            fill=fill,
        )


def shape_mask(shape: int, cx: float, cy: float, r: float, size: int = 32) -> np.ndarray:
    """The ``(size, size)`` bool mask :func:`render` fills for ``shape`` at ``(cx, cy)``, ``r``.

    The same rasteriser call as :func:`render` (one geometry, no copy that drifts): a
    picture rendered with these parameters has its shape's colour exactly on this mask.
    """
    canvas = Image.new("L", (size, size), 0)
    _draw_shape(ImageDraw.Draw(canvas), shape, cx, cy, r, 255)
    return np.asarray(canvas) > 0


def make_captioned(rng: np.random.Generator, size: int = 32) -> tuple[np.ndarray, Attributes]:
    """One picture and its attributes (its caption is ``caption_text(attrs)``)."""
    attrs = sample_attributes(rng)
    return render(attrs, rng, size), attrs


def caption_split(split: str, n: int, size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The first ``n`` pictures of a fixed split: ``(images, labels, captions)``.

    ``images`` is ``(n, size, size, 3)`` uint8, ``labels`` is ``(n, 4)`` int64 (shape,
    colour, position, background), ``captions`` their texts.
    """
    seed = SPLIT_SEEDS.get(split)
    if seed is None:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLIT_SEEDS)}")
    rng = np.random.default_rng([seed, size])
    images = np.empty((n, size, size, 3), dtype=np.uint8)
    labels = np.empty((n, 4), dtype=np.int64)
    captions: list[str] = []
    for i in range(n):
        images[i], attrs = make_captioned(rng, size)
        labels[i] = attrs.as_tuple()
        captions.append(caption_text(attrs))
    return images, labels, captions
