"""Write diffusers pipeline directories with random weights for the tests.

``tiny_*`` pipelines mirror the shipped digit models at a fraction of their width (a
few milliseconds per step). ``public_*`` pipelines use the component classes and
config keys of public checkpoints (google/ddpm-cifar10-32, google/ddpm-celebahq-256,
CompVis/ldm-celebahq-256, facebook/DiT-XL-2-256) at reduced sizes, since nothing can
be downloaded here. Every writer saves with diffusers' ``save_pretrained`` and then
writes the sha256 manifest, exactly as a user serving a downloaded checkpoint does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.models.diffusion.manifest import write_manifest

DIGIT_SCHEDULER = {
    "num_train_timesteps": 50,
    "beta_schedule": "squaredcos_cap_v2",
    "clip_sample": True,
}


def _save(path: Path, pipeline: Any, extra: dict[str, Any] | None = None) -> Path:
    pipeline.save_pretrained(path, safe_serialization=True)
    write_manifest(path, extra)
    return path


def _tiny_unet(size: int, channels: int, num_class_embeds: int | None = None) -> Any:
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=size,
        in_channels=channels,
        out_channels=channels,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=8,
        num_class_embeds=num_class_embeds,
    )


def tiny_unconditional(path: Path) -> Path:
    """16x16x1 UNet2DModel + DDPMScheduler (epsilon, clipped), 50 train steps."""
    from diffusers import DDPMPipeline, DDPMScheduler

    torch.manual_seed(0)
    scheduler = DDPMScheduler(**DIGIT_SCHEDULER)
    return _save(path, DDPMPipeline(unet=_tiny_unet(16, 1), scheduler=scheduler))


def tiny_conditional(path: Path) -> Path:
    """As :func:`tiny_unconditional` with 11 class embeddings (10 = "no label")."""
    from diffusers import DDPMPipeline, DDPMScheduler

    torch.manual_seed(1)
    scheduler = DDPMScheduler(**DIGIT_SCHEDULER)
    unet = _tiny_unet(16, 1, num_class_embeds=11)
    return _save(path, DDPMPipeline(unet=unet, scheduler=scheduler), {"null_class_id": 10})


def tiny_latent(path: Path) -> Path:
    """AutoencoderKL (16x16x1 -> 8x8x2) + latent UNet2DModel (v-prediction)."""
    from diffusers import AutoencoderKL, DDPMScheduler, LDMPipeline

    torch.manual_seed(2)
    vae = AutoencoderKL(
        in_channels=1,
        out_channels=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 8),
        layers_per_block=1,
        latent_channels=2,
        norm_num_groups=4,
        sample_size=16,
        scaling_factor=1.5,
    )
    scheduler = DDPMScheduler(
        **{**DIGIT_SCHEDULER, "clip_sample": False}, prediction_type="v_prediction"
    )
    return _save(path, LDMPipeline(vqvae=vae, unet=_tiny_unet(8, 2), scheduler=scheduler))


def public_ddpm_cifar10(path: Path) -> Path:
    """google/ddpm-cifar10-32's classes and keys: 32x32x3 UNet2DModel, linear DDPM."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(3)
    unet = UNet2DModel(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 32, 32, 32),  # public: 128, 256, 256, 256
        layers_per_block=1,  # public: 2
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        act_fn="silu",
        attention_head_dim=None,
        center_input_sample=False,
        downsample_padding=0,
        flip_sin_to_cos=False,
        freq_shift=1,
        mid_block_scale_factor=1,
        norm_eps=1e-6,
        norm_num_groups=32,
        time_embedding_type="positional",
    )
    scheduler = DDPMScheduler(
        num_train_timesteps=1000,
        beta_schedule="linear",
        beta_start=0.0001,
        beta_end=0.02,
        clip_sample=True,
        variance_type="fixed_large",
    )
    return _save(path, DDPMPipeline(unet=unet, scheduler=scheduler))


def public_ddpm_celebahq(path: Path) -> Path:
    """google/ddpm-celebahq-256's classes and keys at 64x64x3 (six levels)."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(4)
    unet = UNet2DModel(
        sample_size=64,  # public: 256
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 32, 32, 32, 32, 32),  # public: 128 ... 512
        layers_per_block=1,  # public: 2
        down_block_types=(
            "DownBlock2D",
            "DownBlock2D",
            "DownBlock2D",
            "DownBlock2D",
            "AttnDownBlock2D",
            "DownBlock2D",
        ),
        up_block_types=(
            "UpBlock2D",
            "AttnUpBlock2D",
            "UpBlock2D",
            "UpBlock2D",
            "UpBlock2D",
            "UpBlock2D",
        ),
        attention_head_dim=None,
        norm_eps=1e-6,
        norm_num_groups=32,
        downsample_padding=0,
        flip_sin_to_cos=False,
        freq_shift=1,
    )
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=True)
    return _save(path, DDPMPipeline(unet=unet, scheduler=scheduler))


def public_ldm_vq(path: Path) -> Path:
    """CompVis/ldm-celebahq-256's classes and keys: VQModel + UNet2DModel + DDIM."""
    from diffusers import DDIMScheduler, LDMPipeline, UNet2DModel, VQModel

    torch.manual_seed(5)
    vqvae = VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),  # public: 3 levels
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 32),  # public: 128, 256, 512
        layers_per_block=1,
        latent_channels=3,
        num_vq_embeddings=64,  # public: 8192
        vq_embed_dim=3,
        norm_num_groups=32,
        sample_size=32,  # public: 256
    )
    unet = UNet2DModel(
        sample_size=16,  # public: 64
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),  # public: 224, 448, 672, 896
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=32,
        norm_num_groups=32,
    )
    scheduler = DDIMScheduler(
        num_train_timesteps=1000,
        beta_schedule="scaled_linear",
        beta_start=0.0015,
        beta_end=0.0195,
        clip_sample=False,
    )
    return _save(path, LDMPipeline(vqvae=vqvae, unet=unet, scheduler=scheduler))


def public_dit(path: Path) -> Path:
    """facebook/DiT-XL-2-256's classes and keys: class-conditional DiTTransformer2DModel
    (1000 classes, learned sigma) + AutoencoderKL + DDIM, with id2label."""
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    torch.manual_seed(6)
    transformer = DiTTransformer2DModel(
        num_attention_heads=2,  # public: 16
        attention_head_dim=8,  # public: 72
        in_channels=4,
        out_channels=8,
        num_layers=2,  # public: 28
        sample_size=8,  # public: 32
        patch_size=2,
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_zero",
        activation_fn="gelu-approximate",
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),  # public: 4 levels
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 32),  # public: 128, 256, 512, 512
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=32,
        sample_size=16,
        scaling_factor=0.18215,
    )
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler)
    pipe.save_pretrained(path, safe_serialization=True)
    index_path = path / "model_index.json"
    index = json.loads(index_path.read_text())
    index["id2label"] = {str(i): f"class {i}" for i in range(1000)}  # as the public one has
    index_path.write_text(json.dumps(index, indent=2))
    write_manifest(path)
    return path
