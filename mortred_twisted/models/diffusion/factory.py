"""Build a served diffusion model from its options (loader thread).

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

``create`` reads the options (every problem at once), resolves the device and dtype,
loads the verified pipeline (shared between the server's workers) and builds the
request-params schema from what the pipeline offers (steps bounded by its train
timesteps, class ids by its number of classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mortred_twisted.models.base import Model, ModelLoadError
from mortred_twisted.models.diffusion import schedulers
from mortred_twisted.models.diffusion.options import read_options
from mortred_twisted.models.diffusion.pipeline import (
    LoadedPipeline,
    load_pipeline,
    resolve_device,
)
from mortred_twisted.models.diffusion.service import (
    DiffusionModel,
    SamplingPlan,
    resolve_seed,
)
from mortred_twisted.models.params import ParamSpec

MAX_SEED = 2**63 - 1


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


def create_family(family: str, options: Mapping[str, Any], root: Path) -> Model:
    """Build one instance of catalog id ``family``; raises ``ModelLoadError``."""
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
    schema = params_schema(opts.scheduler, steps, trained, opts.eta, opts.max_images)
    if spec.conditional:
        schema += [
            ParamSpec(
                "class_id",
                int,
                minimum=0,
                maximum=pipe.num_classes - 1,
                description="class to draw; absent = drawn per image from the seed",
            ),
            ParamSpec(
                "guidance_scale",
                float,
                default=opts.guidance_scale,
                minimum=0.0,
                maximum=20.0,
                description="classifier-free guidance: 0 = unconditional, 1 = conditional "
                "without guidance, > 1 = eps_u + s (eps_c - eps_u) (one batched pass of 2B)",
            ),
        ]

    def plan(params: Mapping[str, Any]) -> SamplingPlan:
        seed = resolve_seed(params)
        n = int(params["num_images"])
        labels = None
        guidance = 1.0
        if spec.conditional:
            if params.get("class_id") is not None:
                labels = [int(params["class_id"])] * n
            else:
                drawn = np.random.default_rng(seed).integers(0, pipe.num_classes, n)
                labels = [int(v) for v in drawn]
            guidance = float(params["guidance_scale"])
        eta = params.get("eta")
        return SamplingPlan(
            scheduler=str(params["scheduler"]),
            steps=int(params["sample_steps"]),
            eta=float(eta) if eta is not None else None,
            num_images=n,
            seed=seed,
            labels=labels,
            guidance_scale=guidance,
            predicted_x0=bool(params["predicted_x0"]),
        )

    model = DiffusionModel(
        family=family, pipe=pipe, device=device, dtype=dtype, params_schema=schema, plan=plan,
        max_running_jobs=opts.max_running_jobs, max_batch_images=opts.max_batch_images,
        channels_last=opts.channels_last,
    )  # fmt: skip
    if opts.compile:
        model.compile_denoiser()
    return model


def params_schema(
    scheduler: str, steps: int, trained: int, eta: float, max_images: int
) -> list[ParamSpec]:
    """The request params every diffusion model accepts."""
    return [
        ParamSpec(
            "scheduler",
            str,
            default=scheduler,
            choices=schedulers.NAMES,
            description="sampler (diffusers scheduler); formerly 'sampler', still accepted",
        ),
        ParamSpec(
            "sample_steps",
            int,
            default=steps,
            minimum=1,
            maximum=trained,
            description="denoising steps, spread over the trained schedule; formerly "
            "'timesteps' (DDPM), still accepted",
        ),
        ParamSpec(
            "eta",
            float,
            default=eta,
            minimum=0.0,
            maximum=1.0,
            description="scheduler 'ddim' only: 0 = deterministic, 1 = DDPM-like noise",
        ),
        ParamSpec(
            "seed",
            int,
            minimum=0,
            maximum=MAX_SEED,
            description="random seed; absent = a fresh one, echoed in data.seed",
        ),
        ParamSpec(
            "num_images",
            int,
            default=1,
            minimum=1,
            maximum=max_images,
            description="images sampled together in one batch",
        ),
        ParamSpec(
            "predicted_x0",
            bool,
            default=False,
            description="also return snapshots of the predicted clean image",
        ),
    ]
