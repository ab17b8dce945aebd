"""The strict text-to-image judge: 100 % on the renderer, 0 on noise, rejects bad shapes."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mortred_twisted.data.captions import COLOURS, caption_split, render, shape_mask
from training.txt2img import strict_judge
from training.txt2img.strict_judge import judge_pictures, read_picture, why_shape_failed

RED, GREEN = COLOURS["red"], COLOURS["green"]
CIRCLE, SQUARE, TRIANGLE = 0, 1, 2
CENTER = 4
R = 6.8  # a radius inside the renderer's extent range (5.4-7.0 px)


def _picture(draw_shape) -> np.ndarray:
    canvas = Image.new("RGB", (32, 32), GREEN)
    draw_shape(ImageDraw.Draw(canvas))
    return np.asarray(canvas).copy()


def _verdict_for(picture: np.ndarray, named: int) -> tuple[tuple[int, ...], str | None]:
    verdict = read_picture(picture)
    return verdict.as_tuple(), why_shape_failed(verdict, named)


def test_the_renderers_pictures_score_100_percent() -> None:
    """Every attribute of 300 eval-split pictures passes; the named shape fits exactly."""
    images, labels, _ = caption_split("eval", 300)
    row = judge_pictures(images, labels)
    assert {k: row[k] for k in ("shape", "colour", "position", "background", "all_four")} == {
        "shape": 1.0, "colour": 1.0, "position": 1.0, "background": 1.0, "all_four": 1.0,
    }  # fmt: skip
    assert row["shape_iou"] > 0.99


def test_float_pictures_in_the_pipelines_range_read_like_uint8() -> None:
    """A (3, H, W) float picture in [-1, 1] gives the uint8 picture's verdict."""
    images, labels, _ = caption_split("eval", 20)
    floats = images.transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1.0
    assert judge_pictures(floats, labels) == judge_pictures(images, labels)


def test_noise_and_a_blank_picture_score_zero() -> None:
    """Uniform noise reads no colour and no shape; a plain picture has no shape at all."""
    _, labels, _ = caption_split("eval", 100)
    noise = np.random.default_rng(0).integers(0, 256, (100, 32, 32, 3), dtype=np.uint8)
    row = judge_pictures(noise, labels)
    assert row["all_four"] == 0.0 and row["shape"] == 0.0 and row["colour"] == 0.0
    assert row["position"] <= 0.02 and row["background"] == 0.0
    blank = np.broadcast_to(np.array(GREEN, np.uint8), (100, 32, 32, 3))
    row = judge_pictures(blank, labels)
    assert row["shape"] == row["colour"] == row["position"] == row["all_four"] == 0.0
    assert row["fail: no shape"] == 1.0


def test_a_disc_is_not_a_square() -> None:
    """The issue's 'clean red disc' for 'a red square in the center': the fit says circle."""
    disc = _picture(lambda d: d.ellipse([16 - R, 16 - R, 16 + R, 16 + R], fill=RED))
    (shape, colour, place, bg), reason = _verdict_for(disc, SQUARE)
    assert (colour, place, bg) == (0, CENTER, 1)  # red, center, green: only the shape fails
    assert shape == CIRCLE and reason == "wrong class"


@pytest.mark.parametrize("pinch", [0.5, 0.75])
def test_a_pinched_four_point_star_is_not_a_square(pinch: float) -> None:
    """Corners where a square's are, sides pulled in: rejected (low IoU or concave)."""
    h, m = R * 0.85, R * 0.85 * pinch
    star = [(16 - h, 16 - h), (16, 16 - m), (16 + h, 16 - h), (16 + m, 16),
            (16 + h, 16 + h), (16, 16 + m), (16 - h, 16 + h), (16 - m, 16)]  # fmt: skip
    (shape, *_), reason = _verdict_for(_picture(lambda d: d.polygon(star, fill=RED)), SQUARE)
    assert shape != SQUARE and reason in {"low IoU", "concave"}


@pytest.mark.parametrize("tip", [1.4, 1.7])
def test_a_drop_with_a_point_on_top_is_not_a_circle(tip: float) -> None:
    """A circle with a point 2.7-4.8 px above it: the outline is off the ideal circle."""

    def drop(d: ImageDraw.ImageDraw) -> None:
        d.ellipse([16 - R, 16 - R, 16 + R, 16 + R], fill=RED)
        d.polygon([(16 - 0.7 * R, 16 - 0.7 * R), (16 + 0.7 * R, 16 - 0.7 * R),
                   (16, 16 - tip * R)], fill=RED)  # fmt: skip

    (shape, *_), reason = _verdict_for(_picture(drop), CIRCLE)
    assert shape != CIRCLE and reason is not None


def test_a_second_blob_fails_the_shape() -> None:
    """A square plus a stray patch in the far corner: not a well-drawn square."""
    picture = _picture(lambda d: d.rectangle([10, 10, 21, 21], fill=RED))
    picture[1:4, 27:30] = RED
    (shape, *_), reason = _verdict_for(picture, SQUARE)
    assert shape == -1 and reason in {"low IoU", "concave", "outline off"}


def test_the_fit_finds_the_renderers_own_geometry() -> None:
    """shape_mask draws what render fills; the fit recovers each shape with IoU ~1."""
    from mortred_twisted.data.captions import Attributes

    for shape in (CIRCLE, SQUARE, TRIANGLE):
        rng = np.random.default_rng(shape)
        picture = render(Attributes(shape, 0, CENTER, 1), rng)
        fit = strict_judge.fit_shape(~(picture == picture[0, 0]).all(2), shape)
        assert fit.iou > 0.93 and fit.deviation <= 1.5
        assert shape_mask(shape, fit.cx, fit.cy, fit.r).sum() > 50


@pytest.mark.parametrize(
    "bad",
    [np.zeros((32, 32), np.uint8), np.zeros((32, 32, 4), np.uint8), np.zeros((32, 16, 3))],
)
def test_malformed_pictures_are_refused(bad: np.ndarray) -> None:
    """Not (H, W, 3) / (3, H, W), or not square: ValueError, never a verdict."""
    with pytest.raises(ValueError):
        read_picture(bad)


def test_one_label_per_picture() -> None:
    with pytest.raises(ValueError):
        judge_pictures(np.zeros((2, 32, 32, 3), np.uint8), np.zeros((3, 4), np.int64))


def test_pictures_from_the_empty_prompt_score_near_zero() -> None:
    """The shipped pipeline without a prompt draws shapes, but not the ones asked for."""
    from pathlib import Path

    import torch

    from training.txt2img import common
    from training.txt2img.eval_txt2img import generate, load_pipeline

    if not (Path(common.PIPELINE_DIR) / "model_index.json").is_file():
        pytest.skip("weights/txt2img is not trained yet")
    torch.set_num_threads(1)
    pipe = load_pipeline(common.PIPELINE_DIR, "dpmsolver++")
    _, labels, _ = caption_split("eval", 24)
    empty = generate(pipe, [""] * 24, steps=10, guidance=1.0, seed=5, batch=24)
    row = judge_pictures(empty.numpy(), labels)
    assert row["all_four"] <= 1 / 24 and row["colour"] <= 0.5 and row["background"] <= 0.5
    assert row["fail: no shape"] == 0.0  # it does draw a shape: the fails are the prompt's
