"""The samplers a request may choose (``params.scheduler``): diffusers schedulers
built from the pipeline's own scheduler configuration.

Every name maps to a diffusers scheduler class plus overrides; the pipeline's
``scheduler/scheduler_config.json`` supplies what training fixed (number of train
timesteps, beta schedule, prediction type, sample clipping), so any listed scheduler
works with any served pipeline:

* ``ddpm``: ancestral sampling (Ho et al.); fewer steps than trained respace the
  schedule (``timestep_spacing = "trailing"``: the first step is always the last
  train timestep, pure noise);
* ``ddim``: DDIM with ``eta`` (0 = deterministic), trailing spacing as well;
* ``dpmsolver++``: second-order multistep DPM-Solver++ (good at 10-25 steps);
  ``dpmsolver++-karras``: the same on Karras et al.'s sigma spacing;
* ``unipc``: UniPC (second order, predictor-corrector);
* ``euler``, ``euler-karras``: Euler (Karras et al.'s discretisation), deterministic;
* ``euler-ancestral``: Euler with fresh noise at every step.

Pixel-space pipelines trained with ``clip_sample`` (predicted clean images clipped
to ``[-clip_sample_range, clip_sample_range]``) keep that clamp under the multistep
solvers too (their ``thresholding`` with ``sample_max_value = clip_sample_range``,
which for a range of 1.0 is the same static clamp).

A scheduler object keeps per-run state (step index, history), so :func:`make` builds
a fresh one per run; building is cheap (no weights).
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

#: name -> (diffusers class, overrides of the pipeline's scheduler config)
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddpm": ("DDPMScheduler", {"timestep_spacing": "trailing"}),
    "ddim": ("DDIMScheduler", {"timestep_spacing": "trailing"}),
    "dpmsolver++": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "timestep_spacing": "linspace"},
    ),
    "dpmsolver++-karras": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    "unipc": ("UniPCMultistepScheduler", {"solver_order": 2, "timestep_spacing": "linspace"}),
    "euler": ("EulerDiscreteScheduler", {"timestep_spacing": "linspace"}),
    "euler-karras": ("EulerDiscreteScheduler", {"use_karras_sigmas": True}),
    "euler-ancestral": ("EulerAncestralDiscreteScheduler", {"timestep_spacing": "linspace"}),
}
NAMES: tuple[str, ...] = tuple(SCHEDULERS)
#: Schedulers whose ``step`` takes ``eta``.
ETA_SCHEDULERS = frozenset({"ddim"})
_THRESHOLDING = frozenset({"DPMSolverMultistepScheduler", "UniPCMultistepScheduler"})
_DROPPED = frozenset({"clip_sample", "clip_sample_range", "thresholding", "sample_max_value"})


def scheduler_config(name: str, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(class name, config)`` of scheduler ``name`` over the pipeline's ``base`` config."""
    class_name, overrides = SCHEDULERS[name]
    config = {k: v for k, v in base.items() if not k.startswith("_")}
    clip = bool(config.get("clip_sample", False))
    clip_range = float(config.get("clip_sample_range", 1.0) or 1.0)
    if class_name in _THRESHOLDING:
        config = {k: v for k, v in config.items() if k not in _DROPPED}
        if clip:
            config.update(thresholding=True, sample_max_value=clip_range)
    config.update(overrides)
    return class_name, config


@cache
def _class(class_name: str) -> Any:
    import diffusers

    return getattr(diffusers, class_name)


@cache
def step_arguments(class_name: str) -> frozenset[str]:
    """The keyword arguments ``step`` of ``class_name`` accepts (``eta``, ``generator``)."""
    return frozenset(inspect.signature(_class(class_name).step).parameters)


def make(name: str, base: dict[str, Any]) -> Any:
    """A fresh diffusers scheduler ``name`` configured from the pipeline's ``base``."""
    class_name, config = scheduler_config(name, base)
    return _class(class_name).from_config(config)
