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
    SamplingPlan,
    common_params,
    resolve_seed,
)
from mortred_twisted.models.params import ParamSpec


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one CLS_COND_DDIM instance (loader thread); raises ``ModelLoadError``."""
    fam = read_family_options(options, "CLS_COND_DDIM")
    sample_steps, eta = read_ddim_options(fam)
    guidance = fam.reader.get("guidance_scale", float, 2.0, minimum=0.0, maximum=20.0)
    device, net, entry = load_family_unet(fam, options, root, conditional=True)
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
        *ddim_params(fam.schedule.timesteps, sample_steps, eta),
        *common_params(fam.max_images),
        PREDICTED_X0,
    ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        seed = resolve_seed(params)
        n = int(params["num_images"])
        if params.get("class_id") is not None:
            labels = [int(params["class_id"])] * n
        else:
            labels = np.random.default_rng(seed).integers(0, num_classes, n).tolist()
        return ddim_plan(
            params,
            seed=seed,
            labels=[int(v) for v in labels],
            guidance_scale=float(params["guidance_scale"]),
        )

    return DiffusionModel(
        family="CLS_COND_DDIM",
        eps_net=net,
        schedule=fam.schedule,
        device=device,
        params_schema=schema,
        plan=plan,
        sample_shape=pixel_shape(entry),
        image_size=image_size(entry),
        num_classes=num_classes,
    )
