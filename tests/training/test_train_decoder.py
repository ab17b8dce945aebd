"""The txt2img ``decoder`` stage changes the decoder only and re-signs the manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mortred_twisted.models.diffusion.manifest import pipeline_files, read_manifest, verify_files
from training.txt2img import common, train_pipeline

WEIGHTS = Path(common.PIPELINE_DIR) / "vae" / "diffusion_pytorch_model.safetensors"


@pytest.mark.skipif(not WEIGHTS.is_file(), reason="weights/txt2img is not trained yet")
def test_decoder_stage_keeps_the_encoder_and_the_latent_scale(tmp_path: Path) -> None:
    out = tmp_path / "txt2img"
    shutil.copytree(common.PIPELINE_DIR, out)
    before = load_file(WEIGHTS)
    torch.set_num_threads(1)
    train_pipeline.main(["decoder", "--out", str(out), "--train-images", "64", "--steps", "2",
                         "--max-minutes", "0", "--batch", "8", "--threads", "1"])  # fmt: skip
    after = load_file(out / "vae" / "diffusion_pytorch_model.safetensors")
    assert set(after) == set(before)
    for name, value in before.items():
        same = torch.equal(value, after[name])
        assert same == (not name.startswith(("decoder.", "post_quant_conv."))), name
    config = json.loads((out / "vae" / "config.json").read_text())
    old = json.loads((Path(common.PIPELINE_DIR) / "vae" / "config.json").read_text())
    assert config["scaling_factor"] == old["scaling_factor"]
    manifest = read_manifest(out)
    verify_files(out, manifest, pipeline_files(out))
    record = manifest["training"]["decoder"]
    assert record["steps"] == 2 and record["replay"].endswith("--stop-after 2 --max-minutes 0")
    assert "autoencoder" in manifest["training"]  # the earlier stages' records are kept
