"""Evaluate YOLOV8 on the synthetic val split: mAP@0.5 and mAP@0.5:0.95.

Command (under a minute)::

    .venv/bin/python -m training.perception.eval_yolov8 [--val-scenes 500]

Uses the shipped, manifest-verified weights and the served postprocessing with the
usual evaluation settings (score threshold 0.001, NMS IoU 0.6, top-k 100).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from mortred_twisted.data.scenes import CLASS_NAMES, scene_split
from mortred_twisted.models.yolov8.family import create, postprocess, to_tensor
from mortred_twisted.models.yolov8.network import YoloV8, decode
from training.perception.common import ROOT, base_parser, setup
from training.perception.metrics import detection_map


@torch.inference_mode()
def evaluate(net: YoloV8, n_scenes: int = 500) -> dict[str, float]:
    """COCO-style mAP of ``net`` on the first ``n_scenes`` val scenes."""
    net.eval()
    scenes = scene_split("val", n_scenes, net.input_size)
    dets, gts = [], []
    for start in range(0, len(scenes), 100):
        chunk = scenes[start : start + 100]
        boxes, probs = decode(net, net(to_tensor(np.stack([s.image for s in chunk]))))
        for i, s in enumerate(chunk):
            kb, ks, kc = postprocess(boxes[i], probs[i], 0.001, 0.6, 100)
            dets.append((kb.numpy(), ks.numpy(), kc.numpy()))
            gts.append((s.boxes, s.labels))
    result = detection_map(dets, gts, len(CLASS_NAMES))
    return {
        "val_map50": round(result["map50"], 4),
        "val_map50_95": round(result["map50_95"], 4),
        "val_map75": round(result["map@0.75"], 4),
        "val_scenes": n_scenes,
    }


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--val-scenes", type=int, default=500)
    args = parser.parse_args()
    setup(args.seed, args.threads)
    model = create({}, ROOT).instance  # the served family
    print(json.dumps(evaluate(model.net, args.val_scenes), indent=2))


if __name__ == "__main__":
    main()
