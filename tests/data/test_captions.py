"""The captioned-picture generator of the text-to-image model."""

from __future__ import annotations

import numpy as np
import pytest

from mortred_twisted.data import captions
from mortred_twisted.data.captions import (
    ALLOWED_PAIRS,
    ATTRIBUTES,
    COLOURS,
    Attributes,
    caption_split,
    caption_text,
    parse_caption,
)


def test_the_same_seed_gives_the_same_pictures_and_captions() -> None:
    """Two generators with one seed draw identical pictures, labels and captions."""
    a = [captions.make_captioned(np.random.default_rng(5)) for _ in range(2)]
    assert np.array_equal(a[0][0], a[1][0]) and a[0][1] == a[1][1]
    first, second = caption_split("train", 40), caption_split("train", 40)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2]


def test_a_longer_split_extends_a_shorter_one_and_splits_differ() -> None:
    """Picture i of a split does not depend on n; the train and judge splits differ."""
    short, long = caption_split("judge", 10), caption_split("judge", 30)
    assert np.array_equal(short[0], long[0][:10]) and short[2] == long[2][:10]
    assert not np.array_equal(caption_split("train", 10)[0], short[0])
    with pytest.raises(ValueError, match="unknown split"):
        caption_split("nope", 1)


def test_captions_name_their_labels_and_parse_back() -> None:
    """Each caption says its four labels, and parse_caption inverts caption_text."""
    images, labels, texts = caption_split("eval", 200)
    assert images.shape == (200, 32, 32, 3) and images.dtype == np.uint8
    for text, row in zip(texts, labels, strict=True):
        attrs = parse_caption(text)
        assert attrs.as_tuple() == tuple(int(v) for v in row)
        assert caption_text(attrs) == text
    assert caption_text(Attributes(0, 0, 0, 2)) == (
        "a red circle in the top left on a blue background"
    )
    with pytest.raises(ValueError, match="not a caption"):
        parse_caption("a red circle somewhere")


def test_every_value_occurs_and_shape_colour_differs_from_background() -> None:
    """Over a split every attribute value occurs, and no shape is its background's colour."""
    _, labels, _ = caption_split("train", 2000)
    for i, values in enumerate(ATTRIBUTES.values()):
        assert set(labels[:, i].tolist()) == set(range(len(values)))
    assert (labels[:, 1] != labels[:, 3]).all()
    assert len(ALLOWED_PAIRS) == len(COLOURS) * (len(COLOURS) - 1)


def test_the_shape_is_drawn_in_its_place_with_its_colour() -> None:
    """The pixels unlike the background sit in the captioned place and have the shape's colour."""
    rng = np.random.default_rng(0)
    for position, (row, col) in enumerate([(8, 8), (8, 24), (24, 8), (24, 24), (16, 16)]):
        attrs = Attributes(shape=1, colour=0, position=position, background=5)
        image = captions.render(attrs, rng).astype(int)
        corner = image[0, 0] if position != 0 else image[31, 31]
        fg = np.abs(image - corner).sum(-1) > 60
        ys, xs = np.nonzero(fg)
        assert abs(ys.mean() - row) <= 2.5 and abs(xs.mean() - col) <= 2.5
        assert np.abs(image[fg].mean(0) - COLOURS["red"]).max() <= 13
