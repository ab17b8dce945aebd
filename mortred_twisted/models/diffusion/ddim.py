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


def ddim_params(total: int, sample_steps: int, eta: float) -> list[ParamSpec]:
    return [
        ParamSpec(
            "sample_steps",
            int,
            default=sample_steps,
            minimum=1,
            maximum=total,
            description="DDIM steps (evenly spaced over the trained schedule)",
        ),
        ParamSpec(
            "eta",
            float,
            default=eta,
            minimum=0.0,
            maximum=1.0,
            description="0 = deterministic DDIM, 1 = DDPM-like noise",
        ),
    ]


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one DDIM instance (loader thread); raises ``ModelLoadError``."""
    reader = OptionReader(options, "DDIM")
    reader.get("weights", str)
    device_name = reader.get("device", str, "auto")
    schedule = schedule_from_options(reader)
    max_images = reader.get("max_images", int, 16, minimum=1, maximum=256)
    sample_steps = reader.get("sample_steps", int, 50, minimum=1, maximum=schedule.timesteps)
    eta = reader.get("eta", float, 0.0, minimum=0.0, maximum=1.0)
    reader.finish()
    device = pick_device(device_name)
    net, entry = load_unet(reader, root, device, conditional=False)
    check_trained_schedule(entry, schedule, options)
    schema = [
        *ddim_params(schedule.timesteps, sample_steps, eta),
        *common_params(max_images),
        ParamSpec(
            "predicted_x0",
            bool,
            default=False,
            description="also return snapshots of the predicted clean image",
        ),
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        return SamplingPlan(
            sampler="ddim",
            steps=int(params["sample_steps"]),
            eta=float(params["eta"]),
            num_images=int(params["num_images"]),
            seed=resolve_seed(params),
            predicted_x0=bool(params["predicted_x0"]),
        )

    size = int(entry.get("image_size", 16))
    return DiffusionModel(
        family="DDIM",
        eps_net=net,
        schedule=schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=(int(entry["arch"]["in_channels"]), size, size),
        image_size=size,
    )
