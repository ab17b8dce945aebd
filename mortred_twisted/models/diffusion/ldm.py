"""LDM: latent diffusion. A UNet denoises scaled latents of a small KL autoencoder;
the sampled latent is divided by ``latent_scale`` and decoded to an image.

Model options: ``weights`` (latent UNet), ``autoencoder`` (autoencoder weights), both
relative to the project root; ``latent_dims``, ``downscale`` and ``latent_scale`` must
match what the weights were trained with (they are checked against the manifest);
``beta_schedule``/``timesteps``/``beta_start``/``beta_end``; ``sampler`` (``ddim`` or
``ddpm``), ``sample_steps``, ``eta``, ``device``, ``max_images``; ``latent_clip``
(default 5.0; 0 = off) clamps the predicted clean latent to ``[-latent_clip,
latent_clip]`` at every step. Without it the first steps from ``t = T-1``, where the
cosine schedule's ``abar`` is ~1e-9, amplify the denoiser's error into latents far
outside the training range, which the decoder turns into noise; the shipped scaled
training latents lie within +-4.62.

Request ``params``: ``sampler``, ``sample_steps``, ``eta`` (DDIM only), ``seed``,
``num_images``, ``predicted_x0`` (decoded snapshots).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.models.base import Model, ModelLoadError
from mortred_twisted.models.diffusion.autoencoder import AutoencoderConfig, KLAutoencoder
from mortred_twisted.models.diffusion.family import (
    PREDICTED_X0,
    ddim_params,
    ddim_plan,
    image_size,
    load_family_unet,
    read_ddim_options,
    read_family_options,
)
from mortred_twisted.models.diffusion.service import (
    DiffusionModel,
    SamplingPlan,
    common_params,
)
from mortred_twisted.models.diffusion.weights import load_network, resolve_path
from mortred_twisted.models.params import ParamSpec


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one LDM instance (loader thread); raises ``ModelLoadError``."""
    fam = read_family_options(options, "LDM")
    reader = fam.reader
    ae_name = reader.get("autoencoder", str)
    sampler = reader.get("sampler", str, "ddim", choices=("ddim", "ddpm"))
    sample_steps, eta = read_ddim_options(fam)
    latent_dims = reader.get("latent_dims", int, minimum=1)
    downscale = reader.get("downscale", int, minimum=1)
    latent_scale = reader.get("latent_scale", float, minimum=0.0)
    latent_clip = reader.get("latent_clip", float, 5.0, minimum=0.0)
    device, net, entry = load_family_unet(fam, options, root, conditional=False)
    ae_path = resolve_path(ae_name, root, "autoencoder")
    ae, ae_record = load_network(
        ae_path,
        kind="autoencoder",
        device=device,
        build=lambda e: KLAutoencoder(AutoencoderConfig.from_dict(dict(e["arch"]))),
    )
    latent = entry.get("latent", {})
    problems = []
    if latent.get("autoencoder_sha256") != ae_record.sha256:
        problems.append(
            f"the latent UNet was trained on autoencoder {latent.get('autoencoder_sha256')}, "
            f"not on {ae_path.name} ({ae_record.sha256})"
        )
    for key, value in (("latent_dims", latent_dims), ("downscale", downscale)):
        if latent.get(key) != value or ae_record.entry["arch"].get(key) != value:
            problems.append(f"{key} = {value} but the weights use {latent.get(key)}")
    trained_scale = float(latent.get("latent_scale", -1.0))
    if abs(trained_scale - latent_scale) > 1e-4 * max(1.0, abs(trained_scale)):
        problems.append(f"latent_scale = {latent_scale} but training used {trained_scale}")
    if problems:
        raise ModelLoadError("LDM configuration does not match its weights: " + "; ".join(problems))
    schema = [
        ParamSpec("sampler", str, default=sampler, choices=("ddim", "ddpm")),
        *ddim_params(fam.schedule.timesteps, sample_steps, eta),
        *common_params(fam.max_images),
        PREDICTED_X0,
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        chosen = str(params["sampler"])
        eta = float(params["eta"]) if chosen == "ddim" else 1.0
        return ddim_plan(params, sampler=chosen, eta=eta)

    decoder = ae

    def decode(z: torch.Tensor) -> torch.Tensor:
        return decoder.decode(z / latent_scale)  # type: ignore[operator]

    size = image_size(entry)
    return DiffusionModel(
        family="LDM",
        eps_net=net,
        schedule=fam.schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=(latent_dims, size // downscale, size // downscale),
        image_size=size,
        decode=decode,
        clip_x0=latent_clip if latent_clip > 0.0 else None,
    )
