"""Load what a served diffusion model needs from its options (loader thread).

The four catalog ids are one family over diffusers pipelines; they differ only in
what they require of the pipeline and in their defaults:

=================  ==========================  =================  ==================
id                 denoiser                    autoencoder        default scheduler
=================  ==========================  =================  ==================
``DDPM``           unconditional               optional           ``ddpm``
``DDIM``           unconditional               optional           ``ddim``
``CLS_COND_DDIM``  class-conditional           optional           ``ddim``
``LDM``            unconditional               required           ``ddim``
=================  ==========================  =================  ==================

:func:`load_family` reads the options (every problem at once), resolves the device
and dtype, loads the verified pipeline (shared between the server's workers) and
checks it against the family; the served model
(:class:`~mortred_twisted.models.diffusion.service.DiffusionModel`) declares its
request params from what it returns (:func:`~.inputs.configured`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusion.options import DiffusionOptions, read_options
from mortred_twisted.models.diffusion.pipeline import (
    LoadedPipeline,
    load_pipeline,
    resolve_device,
)


@dataclass(frozen=True)
class FamilySpec:
    """What a catalog id requires of its pipeline, and its default scheduler."""

    conditional: bool
    latent: bool | None  # True: autoencoder required; None: either
    scheduler: str


FAMILIES = {
    "DDPM": FamilySpec(conditional=False, latent=None, scheduler="ddpm"),
    "DDIM": FamilySpec(conditional=False, latent=None, scheduler="ddim"),
    "CLS_COND_DDIM": FamilySpec(conditional=True, latent=None, scheduler="ddim"),
    "LDM": FamilySpec(conditional=False, latent=True, scheduler="ddim"),
}


@dataclass(frozen=True)
class LoadedFamily:
    """One catalog id's checked options and pipeline."""

    family: str
    spec: FamilySpec
    options: DiffusionOptions
    device: torch.device
    dtype: torch.dtype
    pipe: LoadedPipeline
    #: the pipeline's ``num_train_timesteps`` (the bound on ``params.sample_steps``)
    trained: int
    #: the default ``params.sample_steps`` (the option, else ``trained``)
    steps: int


def _check_pipeline(family: str, spec: FamilySpec, pipe: LoadedPipeline) -> None:
    where = pipe.path / "model_index.json"
    if spec.conditional and not pipe.num_classes:
        raise ModelLoadError(f"{family} needs a class-conditional denoiser; {where} has none")
    if not spec.conditional and pipe.num_classes:
        raise ModelLoadError(
            f"{family} serves unconditional pipelines; {where} has a class-conditional "
            "denoiser (serve it as CLS_COND_DDIM)"
        )
    if spec.latent and pipe.autoencoder is None:
        raise ModelLoadError(f"{family} needs an autoencoder ('vqvae' or 'vae') in {where}")


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "float32" and device.type != "cuda":
        raise ModelLoadError(f"dtype = {name!r} needs CUDA; the model runs on {device.type}")
    return getattr(torch, name)


def load_family(family: str, options: Mapping[str, Any], root: Path) -> LoadedFamily:
    """Catalog id ``family``'s options checked and pipeline loaded; raises
    ``ModelLoadError`` (bad options, a pipeline the family cannot serve,
    ``sample_steps`` above the trained schedule)."""
    spec = FAMILIES[family]
    opts = read_options(options, family, root, default_scheduler=spec.scheduler)
    device = resolve_device(opts.device)
    dtype = _dtype(opts.dtype, device)
    pipe = load_pipeline(
        opts.pretrained, device, dtype, opts.null_class_id, channels_last=opts.channels_last
    )
    _check_pipeline(family, spec, pipe)
    trained = int(pipe.scheduler_config.get("num_train_timesteps", 1000))
    steps = opts.sample_steps if opts.sample_steps is not None else trained
    if steps > trained:
        raise ModelLoadError(
            f"invalid {family} model options: sample_steps: must be <= {trained} "
            "(the pipeline's num_train_timesteps)"
        )
    return LoadedFamily(family, spec, opts, device, dtype, pipe, trained, steps)
