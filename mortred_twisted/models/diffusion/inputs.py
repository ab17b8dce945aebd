"""The request params of the diffusion families, declared with the SDK (pure).

Each function returns the :class:`~mortred_twisted.sdk.Input` of one ``predict``
parameter (the seed's ``params.<name>``): the class's signature uses them with the
catalog's static defaults, and :func:`configured` (the model's ``configure_inputs``)
gives the same inputs with what the loaded configuration says — the defaults from
the options (``scheduler``, ``sample_steps``, ``eta``, ``guidance_scale``), the bounds
from the pipeline (``sample_steps`` <= its ``num_train_timesteps``, ``class_id`` <=
its number of classes - 1) and ``num_images`` <= the ``max_images`` option. Every
check is in the declaration, so a validation twin (no weights) checks exactly what
the loaded model checks. The order of the inputs is the seed's (the first bad param
of a request is the one reported).

:func:`plan` maps validated params (``predict``'s keyword arguments: an absent param
is None) to a :class:`SamplingPlan`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mortred_twisted.models.diffusion.schedulers import ETA_SCHEDULERS, NAMES
from mortred_twisted.sdk import Input

MAX_SEED = 2**63 - 1
#: Params of the previous hand-written models -> their replacement (still accepted).
RENAMED_PARAMS = {"timesteps": "sample_steps", "sampler": "scheduler"}
#: The widest static bounds (the option readers' own): the loaded model narrows them.
MAX_STEPS_OPTION = 100_000
MAX_IMAGES_OPTION = 256


@dataclass(frozen=True)
class SamplingPlan:
    """What one run does, derived from the normalised params."""

    scheduler: str
    steps: int
    eta: float | None
    num_images: int
    seed: int
    labels: list[int] | None = None
    guidance_scale: float = 1.0
    predicted_x0: bool = False


def scheduler(default: str) -> Input:
    """``params.scheduler`` (formerly ``sampler``)."""
    return Input(
        default,
        choices=NAMES,
        description="sampler (diffusers scheduler); formerly 'sampler', still accepted",
    )


def sample_steps(default: int, trained: int) -> Input:
    """``params.sample_steps`` (formerly ``timesteps``), at most the trained schedule."""
    return Input(
        default,
        ge=1,
        le=trained,
        description="denoising steps, spread over the trained schedule; formerly "
        "'timesteps' (DDPM), still accepted",
    )


def eta(default: float) -> Input:
    """``params.eta``: applies only to the schedulers that take it (given otherwise:
    a 422; its default is then dropped)."""
    return Input(
        default,
        ge=0.0,
        le=1.0,
        only_when={"scheduler": sorted(ETA_SCHEDULERS)},
        description="scheduler 'ddim' only: 0 = deterministic, 1 = DDPM-like noise",
    )


SEED = Input(
    None, ge=0, le=MAX_SEED, description="random seed; absent = a fresh one, echoed in data.seed"
)
PREDICTED_X0 = Input(False, description="also return snapshots of the predicted clean image")


def num_images(max_images: int) -> Input:
    """``params.num_images``, at most the ``max_images`` option."""
    return Input(1, ge=1, le=max_images, description="images sampled together in one batch")


def class_id(num_classes: int | None) -> Input:
    """``params.class_id`` (class-conditional families), below the pipeline's classes."""
    return Input(
        None,
        ge=0,
        le=None if num_classes is None else num_classes - 1,
        description="class to draw; absent = drawn per image from the seed",
    )


def guidance_scale(default: float) -> Input:
    """``params.guidance_scale`` (class-conditional families)."""
    return Input(
        default,
        ge=0.0,
        le=20.0,
        description="classifier-free guidance: 0 = unconditional, 1 = conditional "
        "without guidance, > 1 = eps_u + s (eps_c - eps_u) (one batched pass of 2B)",
    )


def configured(
    *,
    default_scheduler: str,
    steps: int,
    trained: int,
    eta_default: float,
    max_images: int,
    num_classes: int | None = None,
    guidance: float = 2.0,
) -> dict[str, Input]:
    """The inputs as the loaded configuration constrains them (``configure_inputs``);
    ``num_classes`` None: an unconditional family (no class inputs)."""
    inputs = {
        "scheduler": scheduler(default_scheduler),
        "sample_steps": sample_steps(steps, trained),
        "eta": eta(eta_default),
        "num_images": num_images(max_images),
    }
    if num_classes is not None:
        inputs["class_id"] = class_id(num_classes)
        inputs["guidance_scale"] = guidance_scale(guidance)
    return inputs


def resolve_seed(params: Mapping[str, Any]) -> int:
    """The request's seed, or a fresh random one (echoed so the run can be replayed)."""
    seed = params.get("seed")
    return int(seed) if seed is not None else secrets.randbelow(2**31)


def plan(params: Mapping[str, Any], num_classes: int | None) -> SamplingPlan:
    """The run ``params`` ask for; ``num_classes`` None: unconditional. A
    class-conditional run without ``class_id`` draws each image's class from the seed."""
    seed = resolve_seed(params)
    n = int(params["num_images"])
    labels = None
    guidance = 1.0
    if num_classes is not None:
        if params.get("class_id") is not None:
            labels = [int(params["class_id"])] * n
        else:
            drawn = np.random.default_rng(seed).integers(0, num_classes, n)
            labels = [int(v) for v in drawn]
        guidance = float(params["guidance_scale"])
    given_eta = params.get("eta")
    return SamplingPlan(
        scheduler=str(params["scheduler"]),
        steps=int(params["sample_steps"]),
        eta=float(given_eta) if given_eta is not None else None,
        num_images=n,
        seed=seed,
        labels=labels,
        guidance_scale=guidance,
        predicted_x0=bool(params["predicted_x0"]),
    )
