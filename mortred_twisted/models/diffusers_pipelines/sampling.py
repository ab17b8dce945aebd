"""What the pipeline kinds share (worker threads; torch): the result, pictures,
previews, schedulers and the plain denoising loop of the unbatched kinds.

Determinism: the initial noise and every stochastic step draw from one CPU
``torch.Generator`` per run seeded with the run's seed (echoed in the result when the
request gave none), so a seed gives the same pictures on any device up to the
device's arithmetic.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mortred_twisted.model_api.base import InvalidRequest
from mortred_twisted.models.diffusion import schedulers
from mortred_twisted.sdk import Context, Image


@dataclass(frozen=True)
class TextPlan:
    """One prompt-conditioned run, from its normalised inputs and the defaults."""

    prompt: str
    negative_prompt: str
    guidance_scale: float
    steps: int
    scheduler: str
    seed: int
    num_images: int
    width: int
    height: int
    preview_every: int


@dataclass
class Generated:
    """A run's answer: its pictures (PNG result files) and what made them."""

    images: list[Image]
    seed: int
    steps: int
    scheduler: str
    width: int
    height: int


def fresh_seed(seed: int | None) -> int:
    return int(seed) if seed is not None else secrets.randbelow(2**31)


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def noise(shape: tuple[int, ...], gen: torch.Generator, device: Any) -> torch.Tensor:
    """Standard normal noise drawn on the CPU (device-independent), float32, on ``device``."""
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device)


def to_pictures(images: torch.Tensor) -> list[Image]:
    """``(B, C, H, W)`` in ``[-1, 1]`` as PNG :class:`Image` values."""
    pixels = ((images.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    array = pixels.permute(0, 2, 3, 1).cpu().numpy()
    return [Image.from_array(np.ascontiguousarray(a)) for a in array]


def decode(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Latents -> pictures in ``[-1, 1]`` (divided by the VAE's scaling factor)."""
    scale = float(getattr(vae.config, "scaling_factor", 1.0) or 1.0)
    dtype = next(vae.parameters()).dtype
    return vae.decode(latents.to(dtype) / scale).sample.float()


def step_arguments(scheduler: Any, gen: torch.Generator) -> dict[str, Any]:
    accepted = schedulers.step_arguments(type(scheduler).__name__)
    return {"generator": gen} if "generator" in accepted else {}


def check_size(width: int, height: int, multiple: int, max_w: int, max_h: int) -> None:
    """422 naming ``params.width``/``params.height`` for a size the UNet does not take."""
    for name, value, bound in (("width", width, max_w), ("height", height, max_h)):
        if value % multiple:
            raise InvalidRequest(
                f"params.{name}", f"must be a multiple of {multiple} (got {value})"
            )
        if not multiple <= value <= bound:
            raise InvalidRequest(
                f"params.{name}", f"must be in [{multiple}, {bound}] (got {value})"
            )


class Previews:
    """``preview`` events every ``every`` steps (0: none): ``{"step", "total",
    "images"}``, the pictures decoded from the step's prediction of the clean sample
    (the latents themselves when the scheduler gives none)."""

    def __init__(self, ctx: Context, every: int, to_images: Callable[[torch.Tensor], Any]) -> None:
        self.ctx = ctx
        self.every = every
        self.to_images = to_images

    def after(self, step: int, total: int, out: Any, latents: torch.Tensor) -> None:
        if not self.every or step % self.every or step == total:
            return
        x0 = getattr(out, "pred_original_sample", None)
        shown = x0 if x0 is not None else latents
        self.ctx.emit("preview", {"step": step, "total": total, "preview": self.to_images(shown)})


def denoise_loop(
    ctx: Context,
    scheduler: Any,
    x: torch.Tensor,
    predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    gen: torch.Generator,
    previews: Previews,
) -> torch.Tensor:
    """The plain sampling loop: per step ``scale_model_input``, ``predict`` (the
    guided model output), ``step``; then progress, a preview when due and a
    cancellation check (also once before the first step)."""
    timesteps = scheduler.timesteps
    total = len(timesteps)
    kwargs = step_arguments(scheduler, gen)
    ctx.check_cancelled()
    for i, t in enumerate(timesteps):
        model_input = scheduler.scale_model_input(x, t)
        out = scheduler.step(predict(model_input, t), t, x, **kwargs)
        x = out.prev_sample
        ctx.progress(i + 1, total)
        previews.after(i + 1, total, out, x)
        ctx.check_cancelled()
    return x
