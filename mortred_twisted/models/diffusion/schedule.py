"""Noise schedules: betas, cumulative alphas and timestep respacing.

Pure math on numpy ``float64`` (converted to torch by the samplers), so the closed
forms can be tested exactly. Conventions follow Ho et al. (DDPM) and Nichol & Dhariwal
(cosine schedule): ``alphas_cumprod[t] = prod_{s<=t} (1 - betas[s])`` for
``t = 0 .. T-1``; a training example at step ``t`` is
``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BETA_SCHEDULES = ("linear", "cosine")
COSINE_OFFSET = 0.008
MAX_BETA = 0.999


def cosine_alpha_bar(t: np.ndarray | float, s: float = COSINE_OFFSET) -> np.ndarray:
    """The continuous cosine ``abar(t)`` for ``t`` in ``[0, 1]`` (before clipping)."""
    f = np.cos((np.asarray(t, dtype=np.float64) + s) / (1.0 + s) * math.pi / 2.0) ** 2
    f0 = math.cos(s / (1.0 + s) * math.pi / 2.0) ** 2
    return f / f0


def make_betas(
    schedule: str, timesteps: int, beta_start: float = 1e-4, beta_end: float = 0.02
) -> np.ndarray:
    """Return ``betas`` of length ``timesteps``.

    ``linear``: evenly spaced from ``beta_start`` to ``beta_end``. ``cosine``:
    ``beta_t = 1 - abar((t+1)/T) / abar(t/T)``, clipped to ``MAX_BETA``
    (``beta_start``/``beta_end`` are ignored). Raises ``ValueError`` otherwise.
    """
    if timesteps < 1:
        raise ValueError(f"timesteps must be >= 1 (got {timesteps})")
    if schedule == "linear":
        if not 0.0 < beta_start <= beta_end < 1.0:
            raise ValueError(f"need 0 < beta_start <= beta_end < 1 (got {beta_start}, {beta_end})")
        return np.linspace(beta_start, beta_end, timesteps, dtype=np.float64)
    if schedule == "cosine":
        steps = np.arange(timesteps + 1, dtype=np.float64) / timesteps
        abar = cosine_alpha_bar(steps)
        betas = 1.0 - abar[1:] / abar[:-1]
        return np.clip(betas, 0.0, MAX_BETA)
    raise ValueError(f"unknown beta_schedule {schedule!r}; use one of {BETA_SCHEDULES}")


@dataclass(frozen=True)
class NoiseSchedule:
    """A discretised forward process (immutable, shareable between threads)."""

    name: str
    betas: np.ndarray

    @classmethod
    def create(
        cls,
        schedule: str,
        timesteps: int,
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
    ) -> NoiseSchedule:
        return cls(schedule, make_betas(schedule, timesteps, beta_start, beta_end))

    @property
    def timesteps(self) -> int:
        return int(self.betas.shape[0])

    @property
    def alphas_cumprod(self) -> np.ndarray:
        return np.cumprod(1.0 - self.betas)


def respace(total: int, steps: int) -> list[int]:
    """``steps`` increasing timesteps out of ``0 .. total-1``, always ending at ``total-1``.

    Evenly spaced (rounded); ``steps >= total`` gives every timestep. Samplers walk the
    list backwards, so respacing keeps the whole noise range (it never truncates).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (got {steps})")
    if steps >= total:
        return list(range(total))
    if steps == 1:
        return [total - 1]
    raw = np.linspace(0, total - 1, steps).round().astype(np.int64)
    return sorted({int(v) for v in raw})
