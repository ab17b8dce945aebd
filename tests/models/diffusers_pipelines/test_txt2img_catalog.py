"""The TXT2IMG catalog entry loads the pipeline trained here and generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from mortred_twisted.config.server import load_server_config
from mortred_twisted.model_api.base import InferenceRequest, RunContext
from mortred_twisted.models.registry import create_model

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf" / "server" / "diffusion" / "txt2img.toml"

pytestmark = pytest.mark.skipif(
    not (ROOT / "weights" / "txt2img" / "model_index.json").is_file(),
    reason="weights/txt2img is not trained yet (training/txt2img/train_pipeline.py)",
)


def test_the_catalog_entry_loads_and_generates() -> None:
    """TXT2IMG (type diffusers, async jobs on) turns a caption into a 32x32 PNG."""
    config = load_server_config(CONF, env={})
    assert (config.model_type, config.async_enabled) == ("diffusers", True)
    model = create_model(config.model_type, dict(config.model_options), ROOT)
    try:
        assert model.run_capacity == 8
        params = {"prompt": "a red circle in the top left on a blue background", "seed": 1,
                  "sample_steps": 4}  # fmt: skip
        data = model.run(model.validate(InferenceRequest("t", params=params)), RunContext())
        assert (data["width"], data["height"], len(data["images"])) == (32, 32, 1)
        assert data["images"][0]["content_type"] == "image/png"
    finally:
        model.close()
