"""Choose SAM_AMG's filter thresholds on *train* scenes (never on val).

Command (a few minutes)::

    .venv/bin/python -m training.perception.tune_amg [--scenes 60] [--pretrained DIR]

Runs the generator once per scene with every filter open, then replays the filters
(``pred_iou_thresh`` x ``stability_score_thresh``) and box NMS offline, and prints
mean best-match IoU, recall@0.5 and masks per image for each pair, best first. The
chosen pair goes into ``conf/model/segment_anything/sam_amg.toml``; the val figures
then come from :mod:`training.perception.eval_sam_amg`.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from mortred_twisted.data.scenes import scene_split
from mortred_twisted.models.box_ops import nms
from mortred_twisted.models.mortred_v1.mask_generation import DEFAULT_PRETRAINED, create
from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig, masks_to_boxes_xyxy
from training.perception.common import ROOT, base_parser, setup
from training.perception.metrics import mask_matching

IOU_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.88)
STAB_GRID = (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--scenes", type=int, default=60)
    parser.add_argument("--points-per-side", type=int, default=16)
    parser.add_argument("--box-nms-thresh", type=float, default=0.7)
    parser.add_argument(
        "--pretrained", default=DEFAULT_PRETRAINED, help="the SamModel directory to tune for"
    )
    args = parser.parse_args()
    setup(args.seed, args.threads)
    model = create({"pretrained": args.pretrained}, ROOT).instance  # the served family
    open_config = AmgConfig(
        points_per_side=args.points_per_side,
        pred_iou_thresh=-1.0,
        stability_score_thresh=-1.0,
        box_nms_thresh=1.0,
        max_masks=1 << 20,  # every candidate (the request cap does not apply offline)
    )
    # The train split's first scenes: disjoint from val by construction.
    scenes = scene_split("train", args.scenes)
    candidates = []
    for scene in scenes:
        records = model.generator.generate(scene.image, open_config)
        candidates.append(
            (
                torch.from_numpy(np.stack([r["segmentation"] for r in records])),
                torch.tensor([r["predicted_iou"] for r in records]),
                torch.tensor([r["stability_score"] for r in records]),
            )
        )
    rows = []
    for t_iou, t_stab in itertools.product(IOU_GRID, STAB_GRID):
        best, counts = [], []
        for scene, (masks, ious, stabs) in zip(scenes, candidates, strict=True):
            keep = (ious > t_iou) & (stabs > t_stab)
            m, s = masks[keep], ious[keep]
            order = nms(masks_to_boxes_xyxy(m), s, args.box_nms_thresh)
            pred = m[order].numpy()
            best.extend(mask_matching(pred, scene.masks).tolist())
            counts.append(len(order))
        arr = np.array(best)
        rows.append((arr.mean(), (arr >= 0.5).mean(), np.mean(counts), t_iou, t_stab))
    print("mean_best_iou recall50 masks/img pred_iou_thresh stability_score_thresh")
    for row in sorted(rows, reverse=True):
        print(f"{row[0]:.4f} {row[1]:.4f} {row[2]:.2f} {row[3]} {row[4]}")


if __name__ == "__main__":
    main()
