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
from mortred_twisted.models.diffusion.service import (
    DiffusionModel,
    OptionReader,
    SamplingPlan,
    check_trained_schedule,
    common_params,
    load_unet,
    resolve_seed,
    schedule_from_options,
)
from mortred_twisted.models.diffusion.weights import pick_device
from mortred_twisted.models.params import ParamSpec


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one DDPM instance (loader thread); raises ``ModelLoadError``."""
    reader = OptionReader(options, "DDPM")
    reader.get("weights", str)
    device_name = reader.get("device", str, "auto")
    schedule = schedule_from_options(reader)
    max_images = reader.get("max_images", int, 16, minimum=1, maximum=256)
    reader.finish()
    device = pick_device(device_name)
    net, entry = load_unet(reader, root, device, conditional=False)
    check_trained_schedule(entry, schedule, options)
    total = schedule.timesteps
    schema = [
        ParamSpec(
            "timesteps",
            int,
            default=total,
            minimum=1,
            maximum=total,
            description="sampling steps; fewer than configured respace the schedule",
        ),
        *common_params(max_images),
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        return SamplingPlan(
            sampler="ddpm",
            steps=int(params["timesteps"]),
            eta=1.0,
            num_images=int(params["num_images"]),
            seed=resolve_seed(params),
        )

    size = int(entry.get("image_size", 16))
    return DiffusionModel(
        family="DDPM",
        eps_net=net,
        schedule=schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=(int(entry["arch"]["in_channels"]), size, size),
        image_size=size,
    )
