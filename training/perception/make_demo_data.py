"""Write the small demo pictures under ``demo_data/perception/`` (seeded, deterministic).

Command::

    .venv/bin/python -m training.perception.make_demo_data

* ``scene_<i>.png``: scenes 0-5 of the ``demo`` split (64 px) of
  :mod:`mortred_twisted.data.scenes`, plus ``scene_wide.png`` (scene 0 of the demo
  split at 64 px pasted into a 160 x 96 picture, scaled 1.5x: non-square input);
* ``digit_<label>.png``: one held-out digit per class, 32 px grey (ink bright);
* ``digit_canvas_<label>.png``: the same digit scaled and shifted on a noisy 48 px
  canvas (the robustness setting);
* ``ground_truth.json``: boxes ``[x1, y1, x2, y2]`` and class names of every scene.
"""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from mortred_twisted.data.digits import load_digit_split
from mortred_twisted.data.scenes import CLASS_NAMES, render_digit_canvas, scene_split
from training.perception.common import ROOT

OUT = ROOT / "demo_data" / "perception"
WIDE_SCALE = 1.5
WIDE_OFFSET = (40, 0)  # (x, y) of the pasted scene in the wide picture


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    truth: dict[str, object] = {}
    scenes = scene_split("demo", 6)
    for i, scene in enumerate(scenes):
        Image.fromarray(scene.image).save(OUT / f"scene_{i}.png")
        truth[f"scene_{i}.png"] = {
            "boxes": scene.boxes.tolist(),
            "categories": [CLASS_NAMES[k] for k in scene.labels],
        }
    scene = scenes[0]
    side = round(64 * WIDE_SCALE)
    wide = np.full((96, 160, 3), scene.image[0, 0], dtype=np.uint8)
    big = np.asarray(Image.fromarray(scene.image).resize((side, side), Image.NEAREST))
    x0, y0 = WIDE_OFFSET
    wide[y0 : y0 + side, x0 : x0 + side] = big
    Image.fromarray(wide).save(OUT / "scene_wide.png")
    truth["scene_wide.png"] = {
        "boxes": (scene.boxes * WIDE_SCALE + np.array([x0, y0, x0, y0])).tolist(),
        "categories": [CLASS_NAMES[k] for k in scene.labels],
    }
    images, labels = load_digit_split(32, "test")
    rng = np.random.default_rng(11)
    for label in range(10):
        img = images[np.flatnonzero(labels == label)[0]]
        Image.fromarray((img * 255).round().astype(np.uint8)).save(OUT / f"digit_{label}.png")
        canvas = render_digit_canvas(img, rng, 48, (0.8, 1.2), 0.1)
        Image.fromarray((canvas * 255).round().astype(np.uint8)).save(
            OUT / f"digit_canvas_{label}.png"
        )
    (OUT / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n", "utf-8")
    print(f"wrote {len(list(OUT.iterdir()))} files to {OUT}")


if __name__ == "__main__":
    main()
