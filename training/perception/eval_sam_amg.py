"""Evaluate SAM_AMG on the synthetic val split.

Command (a minute or two)::

    .venv/bin/python -m training.perception.eval_sam_amg [--val-scenes 100] [--set KEY=VALUE]
        [--pretrained DIR] [--record]

Runs the served automatic mask generator with the shipped config
(``conf/model/segment_anything/sam_amg.toml``: its model and generator settings) or,
with ``--pretrained DIR``, the same settings over a verified transformers ``SamModel``
directory (e.g. ``weights/perception/sam_amg``), and prints:

* ``amg_mean_best_iou``: mean over ground-truth instances of the best IoU of any
  generated mask; ``amg_recall50``: share of instances with best IoU >= 0.5;
  ``amg_masks_per_image``;
* ``point_miou``: single-point prompting - one point at each instance's innermost
  pixel, the mask with the highest predicted IoU - mean IoU over instances.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from mortred_twisted.data.scenes import scene_split
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.mortred_v1.mask_generation import (
    DEFAULT_PRETRAINED,
    create,
    load_for_eval,
)
from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig
from mortred_twisted.models.transformers_tasks.sam.prompter import SamPrompter
from training.perception.common import ROOT, base_parser, command_line, setup
from training.perception.metrics import mask_iou, mask_matching

CONFIG = ROOT / "conf" / "model" / "segment_anything" / "sam_amg.toml"


def shipped_amg_options() -> dict[str, Any]:
    """The AMG keys of the shipped model config (defaults if the file is absent)."""
    if not CONFIG.is_file():
        return {}
    options = tomllib.loads(CONFIG.read_text("utf-8"))
    return {k: v for k, v in options.items() if k in AmgConfig.__dataclass_fields__}


def innermost_point(mask: np.ndarray) -> tuple[float, float]:
    """Pixel centre of the mask pixel farthest from the background."""
    dist = ndimage.distance_transform_edt(mask)
    y, x = np.unravel_index(int(np.argmax(dist)), mask.shape)
    return x + 0.5, y + 0.5


@torch.inference_mode()
def point_miou(prompter: SamPrompter, scenes: list[Any]) -> float:
    """Mean IoU of the top-scored mask for one innermost point per instance."""
    ious = []
    for scene in scenes:
        if not len(scene.masks):
            continue
        pts = torch.tensor([innermost_point(m) for m in scene.masks], dtype=torch.float32)
        logits, iou = prompter.predict_points(prompter.embed(scene.image), pts)
        best = logits[torch.arange(len(pts)), iou.argmax(1)]
        if best.shape[-2:] != scene.masks.shape[-2:]:  # finer low-res masks: as the AMG
            best = F.interpolate(best[:, None], size=scene.masks.shape[-2:], mode="bilinear")[:, 0]
        best = best > 0
        ious.extend(np.diag(mask_iou(best.numpy(), scene.masks)).tolist())
    return float(np.mean(ious))


def evaluate(
    prompter: SamPrompter,
    n_scenes: int = 100,
    options: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """AMG and single-point figures of ``prompter`` on the first ``n_scenes`` val scenes."""
    opts = shipped_amg_options() if options is None else dict(options)
    model = load_for_eval(prompter, **opts)
    scenes = scene_split("val", n_scenes, 64)
    best, counts = [], []
    for scene in scenes:
        records = model.generator.generate(scene.image, model.config)
        pred = np.stack([r["segmentation"] for r in records]) if records else np.zeros((0, 1, 1))
        best.extend(mask_matching(pred, scene.masks).tolist())
        counts.append(len(records))
    best_arr = np.array(best)
    return {
        "amg_mean_best_iou": round(float(best_arr.mean()), 4),
        "amg_recall50": round(float((best_arr >= 0.5).mean()), 4),
        "amg_masks_per_image": round(float(np.mean(counts)), 2),
        "point_miou": round(point_miou(prompter, scenes), 4),
        "val_scenes": n_scenes,
        "val_instances": len(best_arr),
        "amg_config": opts or "defaults",  # type: ignore[dict-item]
    }


def evaluate_directory(directory: Path, n_scenes: int = 100) -> dict[str, float]:
    """:func:`evaluate` of the verified directory with the shipped generator settings."""
    options = shipped_amg_options()
    model = create({**options, "pretrained": str(directory)}, ROOT).instance
    return evaluate(model.generator.prompter, n_scenes, options)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--val-scenes", type=int, default=100)
    parser.add_argument(
        "--pretrained",
        default=None,
        help=f"evaluate a transformers SamModel directory (e.g. {DEFAULT_PRETRAINED}) "
        "instead of the shipped config's model",
    )
    parser.add_argument(
        "--record", action="store_true", help="store the figures in the weights manifest"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a generator setting of the shipped config (repeatable)",
    )
    args = parser.parse_args()
    setup(args.seed, args.threads)
    options = shipped_amg_options()
    for item in args.set:
        key, _, value = item.partition("=")
        kind = type(getattr(AmgConfig(), key))
        options[key] = kind(value)
    if args.set and args.record:
        parser.error("--record stores the shipped config's figures; drop --set")
    shipped = tomllib.loads(CONFIG.read_text("utf-8"))
    source = (
        {"pretrained": args.pretrained}
        if args.pretrained
        else {"pretrained": shipped.get("pretrained", DEFAULT_PRETRAINED)}
    )
    model = create({**options, **source}, ROOT).instance  # the served family
    figures = evaluate(model.generator.prompter, args.val_scenes, options)
    print(json.dumps(figures, indent=2))
    if args.record:
        directory = ROOT / source["pretrained"]
        write_manifest(directory, {"figures": figures, "eval_command": command_line()})
        print(f"recorded in {directory / 'manifest.json'}")


if __name__ == "__main__":
    main()
