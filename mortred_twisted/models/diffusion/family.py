"""What the four diffusion factories share (loader thread; torch is loaded here).

Every family reads the same core options (``weights``, ``device``, the schedule,
``max_images``), loads a verified UNet whose trained schedule must match the
configured one, offers the DDIM params (``sample_steps``, ``eta``,
``predicted_x0``), and serves a :class:`DiffusionModel`. The family modules
(``ddpm``, ``ddim``, ``cls_cond_ddim``, ``ldm``) keep only what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from mortred_twisted.models.diffusion.schedule import NoiseSchedule
from mortred_twisted.models.diffusion.service import (
    OptionReader,
    SamplingPlan,
    check_trained_schedule,
    load_unet,
    resolve_seed,
    schedule_from_options,
)
from mortred_twisted.models.diffusion.weights import pick_device
from mortred_twisted.models.params import ParamSpec

PREDICTED_X0 = ParamSpec(
    "predicted_x0",
    bool,
    default=False,
    description="also return snapshots of the predicted clean image",
)


@dataclass(frozen=True)
class FamilyOptions:
    """The core options every family reads; ``reader`` still accepts more keys."""

    reader: OptionReader
    device_name: str
    schedule: NoiseSchedule
    max_images: int


def read_family_options(options: Mapping[str, Any], family: str) -> FamilyOptions:
    reader = OptionReader(options, family)
    reader.get("weights", str)
    device_name = reader.get("device", str, "auto")
    schedule = schedule_from_options(reader)
    max_images = reader.get("max_images", int, 16, minimum=1, maximum=256)
    return FamilyOptions(reader, device_name, schedule, max_images)


def read_ddim_options(fam: FamilyOptions) -> tuple[int, float]:
    """The configured defaults of ``sample_steps`` and ``eta``."""
    steps = fam.reader.get("sample_steps", int, 50, minimum=1, maximum=fam.schedule.timesteps)
    eta = fam.reader.get("eta", float, 0.0, minimum=0.0, maximum=1.0)
    return steps, eta


def load_family_unet(
    fam: FamilyOptions, options: Mapping[str, Any], root: Any, *, conditional: bool
) -> tuple[torch.device, torch.nn.Module, Mapping[str, Any]]:
    """Close the option reading (every problem at once), then load the verified UNet
    and check it was trained on the configured schedule."""
    fam.reader.finish()
    device = pick_device(fam.device_name)
    net, entry = load_unet(fam.reader, root, device, conditional=conditional)
    check_trained_schedule(entry, fam.schedule, options)
    return device, net, entry


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


def ddim_plan(params: Mapping[str, Any], *, seed: int | None = None, **extra: Any) -> SamplingPlan:
    """The DDIM sampling plan of normalised ``params``; ``extra`` overrides fields."""
    plan = SamplingPlan(
        sampler="ddim",
        steps=int(params["sample_steps"]),
        eta=float(params["eta"]),
        num_images=int(params["num_images"]),
        seed=resolve_seed(params) if seed is None else seed,
        predicted_x0=bool(params["predicted_x0"]),
    )
    return replace(plan, **extra) if extra else plan


def image_size(entry: Mapping[str, Any]) -> int:
    return int(entry.get("image_size", 16))


def pixel_shape(entry: Mapping[str, Any]) -> tuple[int, int, int]:
    """The per-image sample shape of a UNet working on pixels."""
    size = image_size(entry)
    return (int(entry["arch"]["in_channels"]), size, size)
