"""DDIM: the DDPM digit UNet sampled with Song et al.'s DDIM sampler.

Model options: as :mod:`~mortred_twisted.models.diffusion.ddpm`, plus
``sample_steps`` (default steps per request) and ``eta`` (default stochasticity).

Request ``params``: ``sample_steps`` (1..``timesteps``), ``eta`` (0 = deterministic
given the seed, 1 = DDPM-like variance), ``seed``, ``num_images``, ``predicted_x0``
(bool: also return up to 8 snapshots of the predicted clean image along the way).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.family import (
    PREDICTED_X0,
    ddim_params,
    ddim_plan,
    image_size,
    load_family_unet,
    pixel_shape,
    read_ddim_options,
    read_family_options,
)
from mortred_twisted.models.diffusion.service import (
    DiffusionModel,
    common_params,
)


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one DDIM instance (loader thread); raises ``ModelLoadError``."""
    fam = read_family_options(options, "DDIM")
    sample_steps, eta = read_ddim_options(fam)
    device, net, entry = load_family_unet(fam, options, root, conditional=False)
    schema = [
        *ddim_params(fam.schedule.timesteps, sample_steps, eta),
        *common_params(fam.max_images),
        PREDICTED_X0,
    ]
    return DiffusionModel(
        family="DDIM",
        eps_net=net,
        schedule=fam.schedule,
        device=device,
        params_schema=schema,
        plan=ddim_plan,
        sample_shape=pixel_shape(entry),
        image_size=image_size(entry),
    )
