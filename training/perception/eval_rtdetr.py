"""Evaluate the shipped RTDETR on the synthetic val split, as YOLOV8 is evaluated.

Command (under a minute)::

    .venv/bin/python -m training.perception.eval_rtdetr [--val-scenes 500] [--pretrained DIR]

Loads the manifest-verified transformers directory through the served model's
``create`` and runs the served preprocessing and postprocessing with the usual
evaluation settings (score threshold 0.001, NMS IoU 0.6, top-k 100); prints mAP@0.5,
mAP@0.5:0.95 and mAP@0.75 (:func:`training.perception.metrics.detection_map`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from mortred_twisted.data.scenes import CLASS_NAMES, scene_split
from mortred_twisted.models.mortred_v1.detection import ObjectDetectionModel, create
from training.perception.common import ROOT, base_parser, setup
from training.perception.metrics import detection_map


@torch.inference_mode()
def evaluate(model: ObjectDetectionModel, n_scenes: int = 500) -> dict[str, float]:
    """COCO-style mAP of a served detector on the first ``n_scenes`` val scenes."""
    scenes = scene_split("val", n_scenes, 64)
    dets, gts = [], []
    for start in range(0, len(scenes), 100):
        chunk = scenes[start : start + 100]
        found = model.detect([Image.fromarray(s.image) for s in chunk], 0.001, 0.6, 100)
        for (boxes, scores, labels), s in zip(found, chunk, strict=True):
            dets.append((boxes.numpy(), scores.numpy(), labels.numpy()))
            gts.append((s.boxes, s.labels))
    result = detection_map(dets, gts, len(CLASS_NAMES))
    return {
        "val_map50": round(result["map50"], 4),
        "val_map50_95": round(result["map50_95"], 4),
        "val_map75": round(result["map@0.75"], 4),
        "val_scenes": n_scenes,
    }


def evaluate_directory(directory: Path, n_scenes: int = 500) -> dict[str, float]:
    """:func:`evaluate` of the verified checkpoint directory ``directory``."""
    return evaluate(create({"pretrained": str(directory)}, ROOT).instance, n_scenes)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--val-scenes", type=int, default=500)
    parser.add_argument("--pretrained", default="weights/perception/rtdetr")
    args = parser.parse_args()
    setup(args.seed, args.threads)
    model = create({"pretrained": args.pretrained}, ROOT).instance  # the served family
    print(json.dumps(evaluate(model, args.val_scenes), indent=2))


if __name__ == "__main__":
    main()
