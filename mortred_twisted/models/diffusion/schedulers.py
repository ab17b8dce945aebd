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

A scheduler object keeps per-run state (step index, history), so every run needs a
fresh one. Building one from its configuration (``from_config`` validates the config
and recomputes the train schedule in Python) and ``set_timesteps`` cost ~1 ms on this
CPU, as much as a denoiser call on a batch: :class:`FreshSchedulers` prepares one per
(scheduler, step count) once and hands out deep copies (~0.1 ms), which are in the
state a newly built scheduler is in, so a run's bytes do not change.
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections import OrderedDict
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


class FreshSchedulers:
    """Schedulers ready to step (``set_timesteps`` done, stepping by index), one
    private copy per call, built from one pipeline's ``base`` config on ``device``.

    The prepared originals are never stepped: :meth:`fresh` returns a deep copy, in the
    state a scheduler built by :func:`make` is in after the same preparation. Keeps
    the ``limit`` most recently used (scheduler, steps) pairs. Any thread (a lock
    guards the cache; a copy is private to its caller).
    """

    def __init__(self, base: dict[str, Any], device: Any, limit: int = 64) -> None:
        self._base = base
        self._device = device
        self._limit = max(1, limit)
        self._prepared: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def fresh(self, name: str, steps: int) -> Any:
        """A new scheduler ``name`` set to ``steps`` inference steps."""
        key = (name, steps)
        with self._lock:
            prepared = self._prepared.get(key)
            if prepared is not None:
                self._prepared.move_to_end(key)
        if prepared is None:
            prepared = self._prepare(name, steps)
            with self._lock:
                self._prepared[key] = prepared
                while len(self._prepared) > self._limit:
                    self._prepared.popitem(last=False)
        return copy.deepcopy(prepared)

    def _prepare(self, name: str, steps: int) -> Any:
        scheduler = make(name, self._base)
        scheduler.set_timesteps(steps, device=self._device)
        if hasattr(scheduler, "set_begin_index"):
            # Step by index: Karras spacing can repeat a (rounded) timestep, which
            # would make a lookup by timestep value pick the wrong step.
            scheduler.set_begin_index(0)
        return scheduler
