"""The DDPM and DDIM samplers against an exact denoiser."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mortred_twisted.models.diffusion.sampler import sample
from mortred_twisted.models.diffusion.schedule import NoiseSchedule, respace

CPU = torch.device("cpu")


def oracle(schedule: NoiseSchedule, target: torch.Tensor):
    """The exact eps-predictor when the data distribution is the single point ``target``."""
    abar = torch.tensor(schedule.alphas_cumprod, dtype=torch.float64)

    def eps_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = abar[t].to(torch.float32).view(-1, 1, 1, 1)
        return (x - a.sqrt() * target) / (1 - a).sqrt()

    return eps_fn


@pytest.mark.parametrize("name", ["linear", "cosine"])
@pytest.mark.parametrize(("sampler", "eta"), [("ddim", 0.0), ("ddim", 1.0), ("ddpm", 0.0)])
@pytest.mark.parametrize("steps", [2, 7, 100])
def test_exact_denoiser_recovers_the_data_point(
    name: str, sampler: str, eta: float, steps: int
) -> None:
    """With the exact eps of a one-point distribution every sampler returns that point.

    (One step from t = T-1 is ill-conditioned under the cosine schedule, abar ~ 0, so
    the smallest count tested is two.)
    """
    schedule = NoiseSchedule.create(name, 100)
    target = torch.linspace(-0.9, 0.9, 16).view(1, 1, 4, 4).repeat(3, 1, 1, 1)
    out = sample(
        oracle(schedule, target),
        target.shape,
        schedule,
        respace(100, steps),
        sampler=sampler,
        generator=torch.Generator().manual_seed(0),
        device=CPU,
        eta=eta,
    )
    assert torch.allclose(out, target, atol=1e-4)


@pytest.mark.parametrize(("sampler", "eta"), [("ddim", 0.0), ("ddim", 0.7), ("ddpm", 0.0)])
def test_same_generator_seed_same_bits(sampler: str, eta: float) -> None:
    """Two runs from equally seeded generators are bit-identical."""
    schedule = NoiseSchedule.create("cosine", 50)
    net = torch.nn.Conv2d(1, 1, 3, padding=1)
    runs = [
        sample(
            lambda x, t: net(x),
            (2, 1, 8, 8),
            schedule,
            respace(50, 10),
            sampler=sampler,
            generator=torch.Generator().manual_seed(5),
            device=CPU,
            eta=eta,
        )
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])


def test_on_step_sees_every_step_with_x0() -> None:
    """on_step gets (i, total, pred_x0) for i = 1..total."""
    schedule = NoiseSchedule.create("cosine", 30)
    calls = []
    sample(
        lambda x, t: torch.zeros_like(x),
        (1, 1, 4, 4),
        schedule,
        respace(30, 6),
        sampler="ddim",
        generator=torch.Generator().manual_seed(0),
        device=CPU,
        on_step=lambda i, n, x0: calls.append((i, n, tuple(x0.shape))),
    )
    assert calls == [(i, 6, (1, 1, 4, 4)) for i in range(1, 7)]


def test_clip_bounds_the_output() -> None:
    """With clip_x0 the final image stays in [-1, 1] even for a wild predictor."""
    schedule = NoiseSchedule.create("cosine", 30)
    out = sample(
        lambda x, t: -5 * x,
        (2, 1, 4, 4),
        schedule,
        respace(30, 5),
        sampler="ddpm",
        generator=torch.Generator().manual_seed(0),
        device=CPU,
    )
    assert float(out.abs().max()) <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampler": "euler"}, "unknown sampler"),
        ({"timesteps": []}, "must not be empty"),
        ({"timesteps": [3, 2]}, "strictly increasing"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    """Unknown samplers and malformed timestep lists raise ValueError."""
    args = {"sampler": "ddim", "timesteps": [0, 1]} | kwargs
    with pytest.raises(ValueError, match=message):
        sample(
            lambda x, t: x,
            (1, 1, 2, 2),
            NoiseSchedule.create("cosine", 5),
            args["timesteps"],
            sampler=args["sampler"],
            generator=torch.Generator(),
            device=CPU,
        )


def test_respaced_ddpm_variance_matches_full_chain_at_one_step() -> None:
    """Respacing to every step reproduces Ho et al.'s posterior variance beta~_t."""
    sched = NoiseSchedule.create("linear", 10, 1e-3, 0.2)
    abar = sched.alphas_cumprod
    t = 5
    beta = 1 - abar[t] / abar[t - 1]
    assert beta == pytest.approx(sched.betas[t])
    tilde = beta * (1 - abar[t - 1]) / (1 - abar[t])
    assert tilde == pytest.approx(sched.betas[t] * (1 - abar[t - 1]) / (1 - abar[t]))
    assert np.isfinite(tilde)
