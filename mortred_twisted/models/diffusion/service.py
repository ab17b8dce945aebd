"""The served diffusion model: our sampling loop over diffusers components.

Contracts (see :mod:`mortred_twisted.models.base`):

* :meth:`DiffusionModel.validate` (reactor thread) is the declarative params check
  plus the renamed-param mapping and cross-field checks; it never touches torch.
* :meth:`DiffusionModel.run` (worker thread) builds a fresh diffusers scheduler
  (``params.scheduler``), seeds a private ``torch.Generator`` (``params.seed``, or a
  fresh seed echoed in ``data.seed``), draws the initial noise of all
  ``num_images`` images from it and then drives the scheduler itself:
  ``set_timesteps``, then per step ``scale_model_input``, one denoiser forward pass
  (classifier-free guidance: one batched pass of 2B with the "no label" id), and
  ``step``; after every step it calls ``ctx.progress(step, total)`` and
  ``ctx.check_cancelled()`` (also once before the first step), so a cancelled run
  stops within one step. Latent pipelines decode ``latents / scaling_factor``.
* Determinism: same params (seed included), same device, dtype and thread count ->
  the same PNG bytes. The shared networks are read-only; a run keeps its state in
  locals (its own scheduler object).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mortred_twisted.models.base import InferenceRequest, InvalidRequest, Model, RunContext
from mortred_twisted.models.codec import png_base64
from mortred_twisted.models.diffusion import schedulers
from mortred_twisted.models.diffusion.pipeline import LoadedPipeline
from mortred_twisted.models.params import ParamSpec, validate_params
from mortred_twisted.models.schemas import DIFFUSION_OUTPUT

#: How many intermediate ``predicted_x0`` snapshots a run returns at most.
MAX_X0_SNAPSHOTS = 8
#: Params of the previous hand-written models -> their replacement (still accepted).
RENAMED_PARAMS = {"timesteps": "sample_steps", "sampler": "scheduler"}


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


def resolve_seed(params: Mapping[str, Any]) -> int:
    """The request's seed, or a fresh random one (echoed so the run can be replayed)."""
    seed = params.get("seed")
    return int(seed) if seed is not None else secrets.randbelow(2**31)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``(B, C, H, W)`` in ``[-1, 1]`` -> ``(B, H, W)`` (C = 1) or ``(B, H, W, C)`` uint8."""
    pixels = ((images.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()
    return pixels[..., 0] if pixels.shape[-1] == 1 else pixels


class DiffusionModel(Model):
    """One served diffusion model instance (owned by one worker).

    ``pipe`` is shared and read-only; ``plan`` maps normalised params to a
    :class:`SamplingPlan`.
    """

    uses_images = False
    output_schema = DIFFUSION_OUTPUT

    def __init__(
        self,
        *,
        family: str,
        pipe: LoadedPipeline,
        device: torch.device,
        dtype: torch.dtype,
        params_schema: Sequence[ParamSpec],
        plan: Callable[[Mapping[str, Any]], SamplingPlan],
    ) -> None:
        self.family = family
        self.pipe = pipe
        self.device = device
        self.dtype = dtype
        self.params_schema = tuple(params_schema)
        self._plan = plan
        self.clip = (
            bool(pipe.scheduler_config.get("clip_sample", False)) and pipe.autoencoder is None
        )
        self.prediction_type = str(pipe.scheduler_config.get("prediction_type", "epsilon"))

    def validate(self, request: InferenceRequest) -> InferenceRequest:
        raw = request.params
        renamed: dict[str, str] = {}
        if isinstance(raw, Mapping):
            raw = dict(raw)
            for old, new in RENAMED_PARAMS.items():
                if old in raw:
                    if new in raw:
                        raise InvalidRequest(
                            f"params.{old}", f"replaced by params.{new}; give only {new}"
                        )
                    raw[new] = raw.pop(old)
                    renamed[f"params.{new}"] = old
        try:
            params = validate_params(self.params_schema, raw)
        except InvalidRequest as exc:
            old = renamed.get(exc.field)
            if old is None:
                raise
            new = exc.field.removeprefix("params.")
            raise InvalidRequest(f"params.{old}", f"{exc.message} ({old} is now {new})") from exc
        chosen = params.get("scheduler")
        if "eta" in params and chosen not in schedulers.ETA_SCHEDULERS:
            if isinstance(raw, Mapping) and "eta" in raw:
                raise InvalidRequest(
                    "params.eta", f"applies only to scheduler 'ddim' (scheduler is {chosen!r})"
                )
            params.pop("eta")
        return request.with_params(params)

    def plan(self, params: Mapping[str, Any]) -> SamplingPlan:
        return self._plan(params)

    def _predict(self, x: torch.Tensor, t: torch.Tensor, plan: SamplingPlan) -> torch.Tensor:
        """The denoiser's output for ``x`` at ``t`` (guided when the plan says so)."""
        net = self.pipe.denoiser
        channels = x.shape[1]
        x = x.to(self.dtype)
        tt = t.reshape(1).to(self.device).expand(x.shape[0])
        if plan.labels is None:
            return net(x, tt).sample[:, :channels].float()
        y = torch.tensor(plan.labels, device=self.device, dtype=torch.long)
        null = torch.full_like(y, int(self.pipe.null_class_id or 0))
        s = plan.guidance_scale
        if s in (0.0, 1.0):
            labels = null if s == 0.0 else y
            return net(x, tt, class_labels=labels).sample[:, :channels].float()
        both = net(torch.cat([x, x]), torch.cat([tt, tt]), class_labels=torch.cat([y, null]))
        cond, uncond = both.sample[:, :channels].float().chunk(2)
        return uncond + s * (cond - uncond)

    def _x0(self, x: torch.Tensor, out: torch.Tensor, t: torch.Tensor, abar: torch.Tensor):
        """The predicted clean sample from the (VP-scaled) model input and output."""
        a = abar[round(float(t))].to(x.device)
        if self.prediction_type == "epsilon":
            x0 = (x - (1 - a).sqrt() * out) / a.sqrt()
        elif self.prediction_type == "v_prediction":
            x0 = a.sqrt() * x - (1 - a).sqrt() * out
        else:
            x0 = out
        return x0.clamp(-1.0, 1.0) if self.clip else x0

    def _decode(self, z: torch.Tensor) -> torch.Tensor:
        ae = self.pipe.autoencoder
        if ae is None:
            return z
        return ae.decode(z.to(self.dtype) / self.pipe.scaling_factor).sample

    def run(self, request: InferenceRequest, ctx: RunContext) -> dict[str, Any]:
        plan = self.plan(request.params)
        ctx.check_cancelled()
        scheduler = schedulers.make(plan.scheduler, self.pipe.scheduler_config)
        scheduler.set_timesteps(plan.steps, device=self.device)
        if hasattr(scheduler, "set_begin_index"):
            # Step by index: Karras spacing can repeat a (rounded) timestep, which
            # would make a lookup by timestep value pick the wrong step.
            scheduler.set_begin_index(0)
        timesteps = scheduler.timesteps
        total = len(timesteps)
        accepted = schedulers.step_arguments(type(scheduler).__name__)
        generator = torch.Generator(device=self.device).manual_seed(plan.seed)
        step_kwargs: dict[str, Any] = {}
        if "generator" in accepted:
            step_kwargs["generator"] = generator
        if "eta" in accepted and plan.eta is not None:
            step_kwargs["eta"] = plan.eta
        if "use_clipped_model_output" in accepted:
            # DDIM: re-derive eps from the clipped x0 (as GLIDE and Song et al. do);
            # with the raw output, guided pixel samples drift off their class.
            step_kwargs["use_clipped_model_output"] = True
        snap_steps = (
            set(np.linspace(1, total, min(MAX_X0_SNAPSHOTS, total)).round().astype(int).tolist())
            if plan.predicted_x0
            else set()
        )
        snapshots: list[tuple[int, int, torch.Tensor]] = []
        shape = (plan.num_images, *self.pipe.latent_shape)
        with torch.inference_mode():
            x = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
            x = x * scheduler.init_noise_sigma
            for i, t in enumerate(timesteps):
                model_input = scheduler.scale_model_input(x, t)
                out = self._predict(model_input, t, plan)
                if i + 1 in snap_steps:
                    x0 = self._x0(model_input.float(), out.float(), t, scheduler.alphas_cumprod)
                    snapshots.append((i + 1, round(float(t)), x0))
                x = scheduler.step(out, t, x, **step_kwargs).prev_sample
                ctx.progress(i + 1, total)
                ctx.check_cancelled()
            pixels = to_uint8(self._decode(x))
            data: dict[str, Any] = {
                "images": [png_base64(p) for p in pixels],
                "width": int(pixels.shape[2]),
                "height": int(pixels.shape[1]),
                "channels": 1 if pixels.ndim == 3 else int(pixels.shape[3]),
                "steps": total,
                "seed": plan.seed,
                "scheduler": plan.scheduler,
                "sampler": plan.scheduler,
            }
            if plan.eta is not None:
                data["eta"] = plan.eta
            if plan.labels is not None:
                data["class_ids"] = list(plan.labels)
                data["guidance_scale"] = plan.guidance_scale
            if plan.predicted_x0:
                data["predicted_x0"] = [
                    {
                        "step": step,
                        "timestep": t,
                        "images": [png_base64(p) for p in to_uint8(self._decode(x0))],
                    }
                    for step, t, x0 in snapshots
                ]
        return data
