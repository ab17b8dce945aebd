"""CLS_COND_DDIM: a class-conditional digit UNet sampled with DDIM and
classifier-free guidance.

Model options: as :mod:`~mortred_twisted.models.diffusion.ddim`, plus
``guidance_scale`` (default guidance; the net was trained with 15 % label dropout so
that it also predicts unconditional noise).

Request ``params``: ``class_id`` (0-9; absent = one class per image drawn from the
seed, echoed in ``data.class_ids``), ``guidance_scale`` (0 = unconditional,
1 = conditional without guidance, >1 = guided: ``eps_u + s * (eps_c - eps_u)``, one
batched forward pass of 2B per step), ``sample_steps``, ``eta``, ``seed``,
``num_images``, ``predicted_x0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.ddim import ddim_params
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
    """Build one CLS_COND_DDIM instance (loader thread); raises ``ModelLoadError``."""
    reader = OptionReader(options, "CLS_COND_DDIM")
    reader.get("weights", str)
    device_name = reader.get("device", str, "auto")
    schedule = schedule_from_options(reader)
    max_images = reader.get("max_images", int, 16, minimum=1, maximum=256)
    sample_steps = reader.get("sample_steps", int, 50, minimum=1, maximum=schedule.timesteps)
    eta = reader.get("eta", float, 0.0, minimum=0.0, maximum=1.0)
    guidance = reader.get("guidance_scale", float, 2.0, minimum=0.0, maximum=20.0)
    reader.finish()
    device = pick_device(device_name)
    net, entry = load_unet(reader, root, device, conditional=True)
    check_trained_schedule(entry, schedule, options)
    num_classes = int(entry["arch"]["num_classes"])
    schema = [
        ParamSpec(
            "class_id",
            int,
            minimum=0,
            maximum=num_classes - 1,
            description="digit to draw; absent = drawn per image from the seed",
        ),
        ParamSpec(
            "guidance_scale",
            float,
            default=guidance,
            minimum=0.0,
            maximum=20.0,
            description="classifier-free guidance scale",
        ),
        *ddim_params(schedule.timesteps, sample_steps, eta),
        *common_params(max_images),
        ParamSpec("predicted_x0", bool, default=False),
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        seed = resolve_seed(params)
        n = int(params["num_images"])
        if params.get("class_id") is not None:
            labels = [int(params["class_id"])] * n
        else:
            labels = np.random.default_rng(seed).integers(0, num_classes, n).tolist()
        return SamplingPlan(
            sampler="ddim",
            steps=int(params["sample_steps"]),
            eta=float(params["eta"]),
            num_images=n,
            seed=seed,
            labels=[int(v) for v in labels],
            guidance_scale=float(params["guidance_scale"]),
            predicted_x0=bool(params["predicted_x0"]),
        )

    size = int(entry.get("image_size", 16))
    return DiffusionModel(
        family="CLS_COND_DDIM",
        eps_net=net,
        schedule=schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=(int(entry["arch"]["in_channels"]), size, size),
        image_size=size,
        num_classes=num_classes,
    )
