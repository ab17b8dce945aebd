"""Fixtures of the perception tests: tiny verified checkpoints with random weights
(for behaviour that does not depend on training: batching, isolation, progress,
cancellation, output formats) and picture bytes."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from mortred_twisted.models.classification.weights import write_manifest_entry

ROOT = Path(__file__).resolve().parents[3]

# One intra-op thread: the models are tiny, and spinning thread pools on a shared
# machine cost far more than they save.
torch.set_num_threads(1)
DEMO = ROOT / "demo_data" / "perception"

TINY_ARCHS: dict[str, dict[str, Any]] = {
    "MOBILENETV2": {
        "num_classes": 10,
        "in_channels": 1,
        "width_mult": 0.25,
        "input_size": 16,
        "stem_stride": 2,
        "repeats_scale": 0.3,
        "last_channel": 32,
    },
    "YOLOV8": {"num_classes": 3, "widths": [8, 8, 16, 16], "depth": 1, "reg_max": 8},
    "SAM_AMG": {"dim": 32, "num_masks": 3, "depth": 1, "heads": 2, "input_size": 64},
}


def png_bytes(array: np.ndarray) -> bytes:
    """PNG encoding of a uint8 picture."""
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture()
def tiny_weights(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: a tiny random checkpoint of a model type, listed in a temp manifest."""

    def make(model_type: str) -> Path:
        from mortred_twisted.models.classification import mobilenetv2
        from mortred_twisted.models.detection import yolov8
        from mortred_twisted.models.segment_anything import sam_amg

        builders = {
            "MOBILENETV2": mobilenetv2.build_network,
            "YOLOV8": yolov8.build_network,
            "SAM_AMG": sam_amg.build_network,
        }
        torch.manual_seed(0)
        arch = TINY_ARCHS[model_type]
        net = builders[model_type](arch)
        path = tmp_path / f"tiny_{model_type.lower()}.pt"
        torch.save({"arch": arch, "state_dict": net.state_dict()}, path)
        write_manifest_entry(path, {"model_type": model_type, "command": "tests"})
        return path

    return make


@pytest.fixture()
def demo_bytes() -> Callable[[str], bytes]:
    """Bytes of a file under demo_data/perception."""
    return lambda name: (DEMO / name).read_bytes()
