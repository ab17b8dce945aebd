"""Fixtures: tiny random-weight diffusion models written with a valid manifest.

The nets are deliberately small (8 base channels) so that a run of a few steps takes
milliseconds; their samples are noise, which is all the contract tests need. Tests
that need the trained weights use the shipped configs instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mortred_twisted.models.diffusion.autoencoder import AutoencoderConfig, KLAutoencoder
from mortred_twisted.models.diffusion.unet import UNet, UNetConfig

SCHEDULE = {"beta_schedule": "cosine", "timesteps": 50, "beta_start": 1e-4, "beta_end": 0.02}
TINY = {"base_channels": 8, "channel_mults": [1, 2], "groups": 4, "in_channels": 1}


def write_weights(folder: Path, name: str, module: torch.nn.Module, entry: dict[str, Any]) -> Path:
    """Save ``module``'s state dict as ``folder/name`` and add it to the manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    torch.save(module.state_dict(), path)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest.setdefault("files", {})[name] = {**entry, "sha256": digest}
    manifest_path.write_text(json.dumps(manifest))
    return path


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    """A project root holding tiny unconditional, conditional and latent weights."""
    torch.manual_seed(0)
    folder = tmp_path / "weights" / "diffusion"
    write_weights(
        folder,
        "unet.pt",
        UNet(UNetConfig.from_dict(dict(TINY))),
        {"kind": "unet", "arch": TINY, "schedule": SCHEDULE},
    )
    cond = {**TINY, "num_classes": 10}
    write_weights(
        folder,
        "cond.pt",
        UNet(UNetConfig.from_dict(dict(cond))),
        {"kind": "unet", "arch": cond, "schedule": SCHEDULE},
    )
    ae_arch = {"in_channels": 1, "base_channels": 8, "latent_dims": 2, "downscale": 2, "groups": 4}
    ae_path = write_weights(
        folder,
        "ae.pt",
        KLAutoencoder(AutoencoderConfig.from_dict(dict(ae_arch))),
        {"kind": "autoencoder", "arch": ae_arch},
    )
    latent_arch = {**TINY, "in_channels": 2}
    write_weights(
        folder,
        "latent.pt",
        UNet(UNetConfig.from_dict(dict(latent_arch))),
        {
            "kind": "unet",
            "arch": latent_arch,
            "schedule": SCHEDULE,
            "latent": {
                "autoencoder": "ae.pt",
                "autoencoder_sha256": hashlib.sha256(ae_path.read_bytes()).hexdigest(),
                "latent_scale": 1.5,
                "latent_dims": 2,
                "downscale": 2,
            },
        },
    )
    return tmp_path


BASE_OPTIONS = {"device": "cpu", "beta_schedule": "cosine", "timesteps": 50, "max_images": 4}

OPTIONS: dict[str, dict[str, Any]] = {
    "DDPM": {**BASE_OPTIONS, "weights": "weights/diffusion/unet.pt"},
    "DDIM": {**BASE_OPTIONS, "weights": "weights/diffusion/unet.pt", "sample_steps": 5, "eta": 0.0},
    "CLS_COND_DDIM": {
        **BASE_OPTIONS,
        "weights": "weights/diffusion/cond.pt",
        "sample_steps": 5,
        "guidance_scale": 2.0,
    },
    "LDM": {
        **BASE_OPTIONS,
        "weights": "weights/diffusion/latent.pt",
        "autoencoder": "weights/diffusion/ae.pt",
        "sample_steps": 5,
        "latent_dims": 2,
        "downscale": 2,
        "latent_scale": 1.5,
    },
}


@pytest.fixture
def build(tiny_root: Path) -> Callable[..., Any]:
    """``build(type, **overrides)`` -> a model over the tiny weights."""
    from mortred_twisted.models.registry import create_model

    def _build(model_type: str, **overrides: Any) -> Any:
        return create_model(model_type, {**OPTIONS[model_type], **overrides}, tiny_root)

    return _build
