"""DDPM: the unconditional digit UNet with the ancestral (Ho et al.) sampler.

Model options (``conf/model/diffusion/ddpm.toml``, overridable in the server TOML's
``[model]`` table): ``weights`` (path relative to the project root), ``device``
(``auto``/``cpu``/``cuda``), ``beta_schedule``/``timesteps``/``beta_start``/``beta_end``
(must match the schedule the weights were trained with), ``max_images``.

Request ``params``: ``timesteps`` (1..configured, default = configured: fewer steps
*respace* the schedule evenly, they never truncate it), ``seed``, ``num_images``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.family import (
    image_size,
    load_family_unet,
    pixel_shape,
    read_family_options,
)
from mortred_twisted.models.diffusion.service import (
    DiffusionModel,
    SamplingPlan,
    common_params,
    resolve_seed,
)
from mortred_twisted.models.params import ParamSpec


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one DDPM instance (loader thread); raises ``ModelLoadError``."""
    fam = read_family_options(options, "DDPM")
    device, net, entry = load_family_unet(fam, options, root, conditional=False)
    total = fam.schedule.timesteps
    schema = [
        ParamSpec(
            "timesteps",
            int,
            default=total,
            minimum=1,
            maximum=total,
            description="sampling steps; fewer than configured respace the schedule",
        ),
        *common_params(fam.max_images),
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        return SamplingPlan(
            sampler="ddpm",
            steps=int(params["timesteps"]),
            eta=1.0,
            num_images=int(params["num_images"]),
            seed=resolve_seed(params),
        )

    return DiffusionModel(
        family="DDPM",
        eps_net=net,
        schedule=fam.schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=pixel_shape(entry),
        image_size=image_size(entry),
    )
