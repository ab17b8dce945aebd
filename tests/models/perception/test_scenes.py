"""The synthetic scene generator: deterministic, exact masks, consistent boxes."""

from __future__ import annotations

import numpy as np

from mortred_twisted.data.scenes import (
    MIN_VISIBLE_AREA,
    make_scene,
    mask_to_box,
    render_digit_canvas,
    scene_split,
)


def test_same_seed_same_scene() -> None:
    """Two generators with the same seed draw identical scenes."""
    a = make_scene(np.random.default_rng(5))
    b = make_scene(np.random.default_rng(5))
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.masks, b.masks)


def test_splits_are_fixed_prefixes_and_disjoint() -> None:
    """A longer split extends a shorter one; train and val differ."""
    short, long_ = scene_split("val", 3), scene_split("val", 6)
    for s, t in zip(short, long_[:3], strict=True):
        np.testing.assert_array_equal(s.image, t.image)
    assert not np.array_equal(scene_split("train", 1)[0].image, short[0].image)


def test_masks_boxes_labels_consistent() -> None:
    """Masks are disjoint, large enough, their boxes are tight, labels in range."""
    for scene in scene_split("train", 20):
        assert scene.masks.shape[0] == len(scene.boxes) == len(scene.labels) >= 1
        assert (scene.masks.sum(0) <= 1).all()  # visible parts never overlap
        for m, box in zip(scene.masks, scene.boxes, strict=True):
            assert m.sum() >= MIN_VISIBLE_AREA
            np.testing.assert_array_equal(mask_to_box(m), box)
        assert set(scene.labels.tolist()) <= {0, 1, 2}


def test_mask_pixels_share_one_colour_up_to_noise() -> None:
    """Each instance is flat-coloured: its pixels lie within the added noise of a mean."""
    scene = scene_split("train", 1)[0]
    for m in scene.masks:
        pixels = scene.image[m].astype(float)
        assert pixels.std(0).max() < 10


def test_digit_canvas_is_bounded_and_seeded() -> None:
    """The robustness canvas is in [0, 1], of the asked size, and seeded."""
    digit = np.ones((8, 8), np.float32)
    a = render_digit_canvas(digit, np.random.default_rng(1), 20)
    b = render_digit_canvas(digit, np.random.default_rng(1), 20)
    assert a.shape == (20, 20) and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, b)


def test_scene_generator_imports_no_torch() -> None:
    """The data layer stays torch-free (torch lives under mortred_twisted/models/)."""
    import subprocess
    import sys

    code = "import sys, mortred_twisted.data.scenes; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
