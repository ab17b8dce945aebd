"""Noise schedules and respacing against their closed forms."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mortred_twisted.models.diffusion.schedule import (
    COSINE_OFFSET,
    MAX_BETA,
    NoiseSchedule,
    make_betas,
    respace,
)


def test_linear_betas_closed_form() -> None:
    """Linear betas are evenly spaced from beta_start to beta_end."""
    betas = make_betas("linear", 1000, 1e-4, 0.02)
    assert betas[0] == pytest.approx(1e-4) and betas[-1] == pytest.approx(0.02)
    assert np.allclose(np.diff(betas), (0.02 - 1e-4) / 999)


def test_linear_alpha_bar_is_the_product() -> None:
    """abar_t equals prod_{s<=t}(1 - beta_s), computed independently."""
    sched = NoiseSchedule.create("linear", 200, 1e-4, 0.02)
    expected = [math.prod(1.0 - b for b in sched.betas[: t + 1]) for t in range(200)]
    assert np.allclose(sched.alphas_cumprod, expected, rtol=1e-12)


def test_cosine_alpha_bar_formula() -> None:
    """Cosine abar_t = f((t+1)/T) / f(0) with f(u) = cos^2(((u + s)/(1 + s)) pi/2)."""
    T = 1000
    sched = NoiseSchedule.create("cosine", T)
    s = COSINE_OFFSET

    def f(u: float) -> float:
        return math.cos((u + s) / (1 + s) * math.pi / 2) ** 2

    # Away from the clipped tail, the product of (1 - beta) telescopes exactly.
    for t in (0, 1, 10, 100, 500, 900):
        assert sched.alphas_cumprod[t] == pytest.approx(f((t + 1) / T) / f(0), rel=1e-9)
    assert sched.betas.max() <= MAX_BETA


@given(name=st.sampled_from(["linear", "cosine"]), T=st.integers(min_value=2, max_value=2000))
def test_alpha_bar_monotone_in_unit_interval(name: str, T: int) -> None:
    """abar is strictly decreasing and stays in (0, 1) for any length."""
    abar = NoiseSchedule.create(name, T).alphas_cumprod
    assert np.all(np.diff(abar) < 0)
    assert abar[0] < 1.0 and abar[-1] > 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("quadratic", 10), "unknown beta_schedule"),
        (("linear", 0), "timesteps must be >= 1"),
        (("linear", 10, 0.1, 0.01), "beta_start <= beta_end"),
    ],
)
def test_bad_schedules_raise(args: tuple, message: str) -> None:
    """Unknown names, empty schedules and inverted betas are rejected."""
    with pytest.raises(ValueError, match=message):
        make_betas(*args)


@given(total=st.integers(1, 2000), steps=st.integers(1, 3000))
def test_respace_properties(total: int, steps: int) -> None:
    """Respacing keeps min(steps, total) increasing steps ending at the noisiest step."""
    ts = respace(total, steps)
    assert len(ts) == min(steps, total)
    assert ts[-1] == total - 1
    assert all(0 <= a < b < total for a, b in itertools.pairwise(ts))
    if steps >= 2:
        assert ts[0] == 0
