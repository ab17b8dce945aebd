"""DDPM ancestral and DDIM samplers over a (possibly respaced) timestep list.

Both samplers walk a list of trained timesteps backwards (see
:func:`~mortred_twisted.models.diffusion.schedule.respace`). With the full list the
DDPM sampler is exactly Ho et al.'s ancestral sampler; with a sub-list it uses the
respaced process (``beta'_i = 1 - abar[t_i] / abar[t_{i-1}]``, Nichol & Dhariwal), so
fewer steps still start from pure noise. The DDIM sampler follows Song et al.:
``eta = 0`` is deterministic given the initial noise, ``eta = 1`` matches DDPM's
variance.

Contracts:

* All randomness comes from the caller's ``torch.Generator`` (initial noise, then one
  draw per stochastic step, in a fixed order): same generator state, same device,
  same thread count -> same output bits.
* ``on_step(i, total, pred_x0)`` is called after every step ``i = 1..total`` on the
  calling thread; it is where the caller reports progress and checks cancellation
  (an exception raised there stops the loop before the next network evaluation).
  The loop itself performs no host synchronisation.
* Callers wrap the call in ``torch.inference_mode()``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from mortred_twisted.models.diffusion.schedule import NoiseSchedule

EpsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StepCallback = Callable[[int, int, torch.Tensor], None]

SAMPLERS = ("ddpm", "ddim")


def sample(
    eps_fn: EpsFn,
    shape: Sequence[int],
    schedule: NoiseSchedule,
    timesteps: Sequence[int],
    *,
    sampler: str,
    generator: torch.Generator,
    device: torch.device,
    eta: float = 0.0,
    clip_x0: float | None = 1.0,
    on_step: StepCallback | None = None,
) -> torch.Tensor:
    """Draw samples of ``shape`` by denoising from ``x_T ~ N(0, I)``.

    ``eps_fn(x_t, t)`` predicts the noise (``t`` is an ``int64`` tensor of shape
    ``(B,)``). ``timesteps`` is increasing, each in ``0 .. T-1``. ``clip_x0`` clamps
    the predicted ``x_0`` to ``[-clip_x0, clip_x0]`` (``None``: no clamp, e.g. for
    latents). Returns the final ``x_0`` estimate (``float32``, on ``device``).
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; use one of {SAMPLERS}")
    if not timesteps:
        raise ValueError("timesteps must not be empty")
    abar_all = schedule.alphas_cumprod
    ts = [int(t) for t in timesteps]
    if any(b <= a for a, b in itertools.pairwise(ts)):
        raise ValueError("timesteps must be strictly increasing")
    # Per-step coefficients computed once in float64 on the host: no syncs in the loop.
    abar = np.array([abar_all[t] for t in ts], dtype=np.float64)
    abar_prev = np.concatenate([[1.0], abar[:-1]])
    x = torch.randn(tuple(shape), generator=generator, device=device, dtype=torch.float32)
    batch = int(shape[0])
    total = len(ts)
    for step, i in enumerate(reversed(range(total)), start=1):
        t = torch.full((batch,), ts[i], device=device, dtype=torch.long)
        eps = eps_fn(x, t)
        a_t, a_prev = float(abar[i]), float(abar_prev[i])
        x0 = (x - (1.0 - a_t) ** 0.5 * eps) / a_t**0.5
        if clip_x0 is not None:
            x0 = x0.clamp(-clip_x0, clip_x0)
            eps = (x - a_t**0.5 * x0) / (1.0 - a_t) ** 0.5
        if i == 0:
            x = x0
        elif sampler == "ddpm":
            beta = 1.0 - a_t / a_prev
            coef_x0 = a_prev**0.5 * beta / (1.0 - a_t)
            coef_xt = (1.0 - beta) ** 0.5 * (1.0 - a_prev) / (1.0 - a_t)
            var = beta * (1.0 - a_prev) / (1.0 - a_t)
            noise = torch.randn(x.shape, generator=generator, device=device)
            x = coef_x0 * x0 + coef_xt * x + var**0.5 * noise
        else:
            sigma = eta * ((1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev)) ** 0.5
            dir_coef = max(1.0 - a_prev - sigma**2, 0.0) ** 0.5
            x = a_prev**0.5 * x0 + dir_coef * eps
            if sigma > 0.0:
                noise = torch.randn(x.shape, generator=generator, device=device)
                x = x + sigma * noise
        if on_step is not None:
            on_step(step, total, x0)
    return x
