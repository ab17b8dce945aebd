"""Tiny random-weight diffusers pipeline directories, written at test time with the
libraries' own classes and ``save_pretrained`` (no downloads): a Stable Diffusion
pipeline (CLIP text encoder + a tokenizer whose vocabulary is written here, a
``UNet2DConditionModel``, an ``AutoencoderKL``, a DDIM scheduler), a DiT pipeline
and a DDPM pipeline. Seeded, so a directory's weights are the same on every run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: The words the tiny tokenizer knows (each one token).
WORDS = (
    "a", "red", "green", "blue", "circle", "square", "on", "the", "left", "right",
    "top", "bottom", "background", "digit", "seven", "thick", "stroke",
)  # fmt: skip
MAX_TOKENS = 16
TEXT_WIDTH = 32


def tiny_tokenizer() -> Any:
    """A ``CLIPTokenizer`` over :data:`WORDS` (plus single letters, so any text
    tokenizes), built from a vocabulary and merges written here."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    letters = sorted({c for w in WORDS for c in w} | set("abcdefghijklmnopqrstuvwxyz"))
    for c in letters:
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        # merge left to right: "r e d</w>" -> "re d</w>" -> "red</w>"
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            joined = pair[0] + pair[1]
            if pair not in merges:
                merges.append(pair)
            vocab.setdefault(joined, len(vocab))
            parts = [joined, *parts[2:]]
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=MAX_TOKENS)


def tiny_text_encoder(vocab_size: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=MAX_TOKENS,
        hidden_act="quick_gelu", bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return CLIPTextModel(config)


def tiny_vae() -> Any:
    """32x32x3 <-> 8x8x4 (a scale factor of 4)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16), layers_per_block=1, latent_channels=4,
        norm_num_groups=8, sample_size=32,
    )  # fmt: skip


def tiny_unet(in_channels: int = 4) -> Any:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, in_channels=in_channels, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEXT_WIDTH, attention_head_dim=4, norm_num_groups=8,
    )  # fmt: skip


def scheduler_config() -> dict[str, Any]:
    return {
        "num_train_timesteps": 1000, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
        "beta_end": 0.012, "clip_sample": False, "prediction_type": "epsilon",
        "set_alpha_to_one": False, "steps_offset": 1,
    }  # fmt: skip


def stable_diffusion(out: Path, *, seed: int = 0, pipeline_class: str | None = None) -> Path:
    """A tiny ``StableDiffusionPipeline`` directory at ``out`` (32x32 pictures);
    ``pipeline_class`` saves the same parts under another pipeline class
    (``StableDiffusionImg2ImgPipeline``, ``StableDiffusionInpaintPipeline``)."""
    import diffusers

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    cls = getattr(diffusers, pipeline_class or "StableDiffusionPipeline")
    inpaint_unet = pipeline_class == "StableDiffusionInpaintPipeline"
    pipe = cls(
        vae=tiny_vae(), text_encoder=tiny_text_encoder(len(tokenizer)), tokenizer=tokenizer,
        unet=tiny_unet(9 if inpaint_unet else 4),
        scheduler=diffusers.DDIMScheduler(**scheduler_config()),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(out)
    return out


def dit(out: Path, *, seed: int = 0, num_classes: int = 3) -> Path:
    """A tiny ``DiTPipeline`` (a ``DiTTransformer2DModel`` over 8x8x4 latents, the
    tiny VAE, DDIM) with labels ``id2label``."""
    from diffusers import DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    torch.manual_seed(seed)
    transformer = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=1, sample_size=8, patch_size=2, num_embeds_ada_norm=num_classes,
        norm_num_groups=8,
    )  # fmt: skip
    scheduler = DDIMScheduler(**{**scheduler_config(), "beta_schedule": "linear",
                                 "beta_start": 0.0001, "beta_end": 0.02})  # fmt: skip
    labels = {i: name for i, name in enumerate(("cat", "dog", "bird", "fish")[:num_classes])}
    pipe = DiTPipeline(transformer=transformer, vae=tiny_vae(), scheduler=scheduler,
                       id2label=labels)  # fmt: skip
    pipe.save_pretrained(out)
    return out


def ddpm(out: Path, *, seed: int = 0) -> Path:
    """A tiny ``DDPMPipeline`` (a pixel ``UNet2DModel`` at 16x16x3)."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=8,
    )  # fmt: skip
    scheduler = DDPMScheduler(num_train_timesteps=1000, clip_sample=True)
    DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(out)
    return out


def sdxl(out: Path, *, seed: int = 0) -> Path:
    """A tiny ``StableDiffusionXLPipeline`` (two CLIP text encoders, the second with a
    projection; a UNet with SDXL's ``text_time`` added conditioning), 32x32 pictures."""
    import diffusers
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=MAX_TOKENS,
        hidden_act="quick_gelu", bos_token_id=0, eos_token_id=1, pad_token_id=1,
        projection_dim=TEXT_WIDTH,
    )  # fmt: skip
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=2 * TEXT_WIDTH, attention_head_dim=4, norm_num_groups=8,
        addition_embed_type="text_time", addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + TEXT_WIDTH,
    )  # fmt: skip
    pipe = diffusers.StableDiffusionXLPipeline(
        vae=tiny_vae(), text_encoder=tiny_text_encoder(len(tokenizer)),
        text_encoder_2=CLIPTextModelWithProjection(config), tokenizer=tokenizer,
        tokenizer_2=tokenizer, unet=unet,
        scheduler=diffusers.EulerDiscreteScheduler(**{
            k: v for k, v in scheduler_config().items()
            if k not in ("clip_sample", "set_alpha_to_one")
        }),
    )  # fmt: skip
    pipe.save_pretrained(out)
    return out
