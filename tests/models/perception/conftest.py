"""Fixtures of the perception tests: tiny verified checkpoints with random weights
(for behaviour that does not depend on training: batching, isolation, progress,
cancellation, output formats) and picture bytes.

YOLOV8 (our own network) gets a tiny ``.pt`` checkpoint; the transformers families get
a reduced stand-in of a public checkpoint (:mod:`tests.models.perception.checkpoints`),
built once per test session."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from mortred_twisted.models.weights import write_manifest_entry

ROOT = Path(__file__).resolve().parents[3]

# One intra-op thread: the models are tiny, and spinning thread pools on a shared
# machine cost far more than they save.
torch.set_num_threads(1)
DEMO = ROOT / "demo_data" / "perception"

TINY_ARCHS: dict[str, dict[str, Any]] = {
    "YOLOV8": {"num_classes": 3, "widths": [8, 8, 16, 16], "depth": 1, "reg_max": 8},
}


def png_bytes(array: np.ndarray) -> bytes:
    """PNG encoding of a uint8 picture."""
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture()
def tiny_weights(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: a tiny random checkpoint of YOLOV8, listed in a temp manifest."""

    def make(model_type: str) -> Path:
        from mortred_twisted.models.yolov8 import family as yolov8

        torch.manual_seed(0)
        arch = TINY_ARCHS[model_type]
        net = yolov8.build_network(arch)
        path = tmp_path / f"tiny_{model_type.lower()}.pt"
        torch.save({"arch": arch, "state_dict": net.state_dict()}, path)
        write_manifest_entry(path, {"model_type": model_type, "command": "tests"})
        return path

    return make


@pytest.fixture(scope="session")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: the (session-cached) reduced stand-in checkpoint directory of a family
    (``IMAGE_CLASSIFICATION``, ``OBJECT_DETECTION``, ``SAM_AMG``). Tests that alter a
    directory copy it first."""
    from tests.models.perception.checkpoints import build

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = build(family, tmp_path_factory.mktemp(family.lower()))
        return made[family]

    return make


@pytest.fixture()
def demo_bytes() -> Callable[[str], bytes]:
    """Bytes of a file under demo_data/perception."""
    return lambda name: (DEMO / name).read_bytes()
