"""Draw the pictures of ``docs/models/perception.md`` from the shipped models.

Command (seconds)::

    .venv/bin/python -m training.perception.draw_figures

Writes ``docs/img/perception_mobilenetv2.png`` (robust-setting demo digits with the
predicted class), ``docs/img/perception_yolov8.png`` (detections drawn on the demo
scenes, score threshold from the config) and ``docs/img/perception_sam_amg.png`` (demo
scenes and their generated masks overlaid). Pictures are upscaled 4x (nearest).
"""

from __future__ import annotations

import tomllib
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.models.codec import decode_image
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.transformers_tasks.sam.masks import overlay, rle_to_mask
from training.perception.common import ROOT, base_parser, setup

DEMO = ROOT / "demo_data" / "perception"
IMG = ROOT / "docs" / "img"
UP = 4
COLOURS = {"circle": (255, 60, 60), "rectangle": (40, 220, 60), "triangle": (60, 120, 255)}


def _model(model_type: str, config: str) -> Model:
    return create_model(model_type, tomllib.loads((ROOT / config).read_text()), ROOT)


def _run(model: Model, name: str, **params: object) -> Any:
    req = model.validate(InferenceRequest("fig", ((DEMO / name).read_bytes(),), params))
    return model.run(req, RunContext())


def _up(rgb: np.ndarray) -> Image.Image:
    return Image.fromarray(rgb).resize((rgb.shape[1] * UP, rgb.shape[0] * UP), Image.NEAREST)


def _row(tiles: list[Image.Image], pad: int = 6) -> Image.Image:
    height = max(t.height for t in tiles)
    out = Image.new("RGB", (sum(t.width for t in tiles) + pad * (len(tiles) - 1), height), "white")
    x = 0
    for t in tiles:
        out.paste(t, (x, 0))
        x += t.width + pad
    return out


def draw_mobilenet() -> None:
    model = _model("MOBILENETV2", "conf/model/classification/mobilenetv2.toml")
    tiles = []
    for label in range(10):
        name = f"digit_canvas_{label}.png"
        data = _run(model, name)
        tile = _up(decode_image((DEMO / name).read_bytes())).convert("RGB")
        draw = ImageDraw.Draw(tile)
        ok = data["class_id"] == label
        draw.text(
            (4, 2),
            f"{data['category']} {max(data['scores']):.2f}",
            fill=(80, 255, 80) if ok else (255, 80, 80),
        )
        tiles.append(tile)
    _row(tiles).save(IMG / "perception_mobilenetv2.png")


def draw_yolo() -> None:
    model = _model("YOLOV8", "conf/model/object_detection/yolov8.toml")
    tiles = []
    for name in ("scene_0.png", "scene_1.png", "scene_2.png", "scene_3.png", "scene_wide.png"):
        dets = _run(model, name)
        tile = _up(decode_image((DEMO / name).read_bytes()))
        draw = ImageDraw.Draw(tile)
        for d in dets:
            box = [v * UP for v in d["bbox"]]
            colour = COLOURS[d["category"]]
            draw.rectangle(box, outline=colour, width=2)
            draw.text(
                (box[0] + 2, box[1] + 1), f"{d['category'][:4]} {d['score']:.2f}", fill=colour
            )
        tiles.append(tile)
    _row(tiles).save(IMG / "perception_yolov8.png")


def draw_sam() -> None:
    model = _model("SAM_AMG", "conf/model/segment_anything/sam_amg.toml")
    tiles = []
    for name in ("scene_0.png", "scene_1.png", "scene_4.png"):
        rgb = decode_image((DEMO / name).read_bytes())
        data = _run(model, name)
        masks = [rle_to_mask(m["segmentation"]) for m in data["masks"]]
        tiles += [_up(rgb), _up(overlay(rgb, masks))]
    _row(tiles).save(IMG / "perception_sam_amg.png")


def main() -> None:
    args = base_parser(__doc__ or "").parse_args()
    setup(args.seed, args.threads)
    IMG.mkdir(parents=True, exist_ok=True)
    draw_mobilenet()
    draw_yolo()
    draw_sam()
    print(f"wrote {IMG}/perception_*.png")


if __name__ == "__main__":
    main()
