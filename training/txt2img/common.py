"""Shared pieces of the text-to-image training scripts (paths, data, components).

The pipeline is diffusers' Stable Diffusion layout built from the libraries' own
classes: a word-level ``CLIPTokenizer`` (BPE trained here on the caption words, every
word one token), a small ``CLIPTextModel``, an ``AutoencoderKL`` 32x32x3 -> 8x8x4 and a
``UNet2DConditionModel`` on its latents, with a ``DDIMScheduler`` of Stable Diffusion's
``scaled_linear`` betas (epsilon prediction). Every script is one seeded command,
single-process; ``--threads`` sets ``torch.set_num_threads``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mortred_twisted.data.captions import SPLIT_SEEDS, caption_split, caption_words

ROOT = Path(__file__).resolve().parents[2]
PIPELINE_DIR = ROOT / "weights" / "txt2img"
JUDGE_DIR = ROOT / "weights" / "txt2img_judge"
IMAGE_SIZE = 32
MAX_TOKENS = 16
TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": MAX_TOKENS,
    "hidden_act": "quick_gelu",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
}
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "clip_sample": False,
    "set_alpha_to_one": False,
    "steps_offset": 1,
}


def data_description(split: str, n: int) -> str:
    return (
        f"mortred_twisted.data.captions.caption_split({split!r}, {n}, {IMAGE_SIZE}) "
        f"(seed {SPLIT_SEEDS[split]}), pixels scaled to [-1, 1]"
    )


def setup(seed: int, threads: int) -> None:
    """Seed every generator and set the thread count (CPU only: the dev machine)."""
    torch.set_num_threads(max(1, threads))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def command_line() -> str:
    module = Path(sys.argv[0]).resolve().relative_to(ROOT).with_suffix("")
    return " ".join([".venv/bin/python -m " + ".".join(module.parts), *sys.argv[1:]])


def images_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(N, H, W, 3)`` -> float ``(N, 3, H, W)`` in ``[-1, 1]``."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def split_tensors(split: str, n: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    images, labels, captions = caption_split(split, n, IMAGE_SIZE)
    return images_tensor(images), torch.from_numpy(labels), captions


def make_tokenizer() -> Any:
    """A ``CLIPTokenizer`` whose BPE, trained here on :func:`caption_words`, keeps words whole."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<|startoftext|>", "<|endoftext|>"],
        end_of_word_suffix="</w>",
        show_progress=False,
        min_frequency=1,
    )
    bpe.train_from_iterator(caption_words(), trainer=trainer)
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split()) for m in spec["merges"]]
    tokenizer = CLIPTokenizer(vocab=spec["vocab"], merges=merges, model_max_length=MAX_TOKENS)
    for word in caption_words():
        ids = tokenizer(word).input_ids
        if len(ids) != 3:
            raise RuntimeError(f"caption word {word!r} is not one token: {ids}")
    return tokenizer


def make_text_encoder(vocab_size: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig(vocab_size=vocab_size, **TEXT_CONFIG))


def make_autoencoder() -> Any:
    """AutoencoderKL 32x32x3 -> 8x8x4 (two downsamplings), 16/32/64 channels."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 64),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=IMAGE_SIZE,
    )


def make_unet() -> Any:
    """UNet2DConditionModel at 8x8x4: 32/64 channels, cross-attention at both levels."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=IMAGE_SIZE // 4,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEXT_CONFIG["hidden_size"],
        attention_head_dim=4,
        norm_num_groups=8,
    )


def make_scheduler() -> Any:
    from diffusers import DDIMScheduler

    return DDIMScheduler(**SCHEDULER_CONFIG)


def tokenize(tokenizer: Any, captions: list[str]) -> torch.Tensor:
    """Token ids exactly as ``StableDiffusionPipeline.encode_prompt`` makes them."""
    return tokenizer(
        captions,
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids
