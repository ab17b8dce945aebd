"""The shipped text-to-image pipeline (weights/txt2img) and its judge load and work.

The pipeline is diffusers' Stable Diffusion layout trained by
``training/txt2img/train_pipeline.py``; these tests check the committed files against
their manifests, load them the way a user would (``from_pretrained`` with local files
only) and generate, without the model server (the server side has its own tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mortred_twisted.data.captions import caption_words
from mortred_twisted.models.diffusion.manifest import pipeline_files, read_manifest, verify_files
from training.txt2img import common
from training.txt2img.judge import load_judge

ROOT = Path(__file__).resolve().parents[3]
PIPELINE = ROOT / "weights" / "txt2img"
JUDGE = ROOT / "weights" / "txt2img_judge"
PROMPT = "a red circle in the top left on a blue background"


@pytest.fixture(scope="module")
def pipe():
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(PIPELINE, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.mark.parametrize("folder", [PIPELINE, JUDGE], ids=["pipeline", "judge"])
def test_manifest_lists_exactly_the_committed_files(folder: Path) -> None:
    """Each manifest lists every file of its directory with a matching sha256, small for git."""
    manifest = read_manifest(folder)
    files = pipeline_files(folder)
    assert set(manifest["files"]) == set(files)
    verify_files(folder, manifest, files)
    assert sum((folder / rel).stat().st_size for rel in files) < 8 * 1024 * 1024


def test_manifest_records_how_the_pipeline_was_trained_and_measured() -> None:
    """Both training stages name their replayable command, and the judge's figures are there."""
    manifest = read_manifest(PIPELINE)
    for stage in ("autoencoder", "unet_and_text_encoder"):
        record = manifest["training"][stage]
        assert record["replay"].startswith(".venv/bin/python -m training.txt2img.train_pipeline")
        assert record["steps"] > 0 and record["loss_curve"]
    figures = manifest["figures"]
    assert figures, "run training.txt2img.eval_txt2img --write-manifest"
    for entry in figures.values():
        assert entry["command"].startswith(".venv/bin/python -m training.txt2img.eval_txt2img")
    ceilings = [e["rows"].get("eval-split pictures (ceiling)") for e in figures.values()]
    assert any(row and set(row) >= {"shape", "all_four"} for row in ceilings)


def test_directory_is_a_stable_diffusion_pipeline_without_safety_checker(pipe) -> None:
    """model_index.json names the SD pipeline and its parts; no checker, no feature extractor."""
    index = json.loads((PIPELINE / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    assert index["requires_safety_checker"] is False
    assert pipe.safety_checker is None and pipe.feature_extractor is None
    names = {k: type(v).__name__ for k, v in pipe.components.items() if v is not None}
    assert names == {
        "vae": "AutoencoderKL",
        "text_encoder": "CLIPTextModel",
        "tokenizer": "CLIPTokenizer",
        "unet": "UNet2DConditionModel",
        "scheduler": "DDIMScheduler",
    }
    assert pipe.unet.config.cross_attention_dim == pipe.text_encoder.config.hidden_size
    assert pipe.vae.config.latent_channels == pipe.unet.config.in_channels == 4
    assert pipe.unet.config.sample_size * pipe.vae_scale_factor == 32


def test_tokenizer_keeps_every_caption_word_whole(pipe) -> None:
    """The vocabulary made here maps each caption word to one token and fits a caption."""
    for word in caption_words():
        assert len(pipe.tokenizer(word).input_ids) == 3, word
    ids = pipe.tokenizer(PROMPT).input_ids
    assert len(ids) == 13 <= pipe.tokenizer.model_max_length
    assert pipe.tokenizer.decode(ids, skip_special_tokens=True).strip() == PROMPT


def test_two_step_generation_gives_a_32_pixel_rgb_picture_reproducibly(pipe) -> None:
    """A prompt sampled in two steps with guidance is a 32x32 RGB picture; same seed, same bytes."""

    def sample() -> np.ndarray:
        out = pipe(
            PROMPT,
            num_inference_steps=2,
            guidance_scale=5.0,
            generator=torch.Generator().manual_seed(0),
        )
        (image,) = out.images
        assert (image.size, image.mode) == ((32, 32), "RGB")
        assert out.nsfw_content_detected is None
        return np.asarray(image)

    assert np.array_equal(sample(), sample())


def test_judge_reads_training_distribution_pictures() -> None:
    """The judge loads from its checked directory and reads held-out pictures' attributes."""
    judge = load_judge(JUDGE)
    x, labels, _ = common.split_tensors("eval", 300)
    hit = (judge.predict(x) == labels).float().mean(0)
    assert hit.min() > 0.95, hit
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert (judge.predict(noise) == labels).all(1).float().mean() < 0.05
