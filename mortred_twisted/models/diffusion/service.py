"""The served diffusion model: our sampling loop over diffusers components.

:class:`DiffusionModel` is a :class:`~mortred_twisted.sdk.ServedModel` with the
seed's contract (``"mortred-v1"``: the params, 422 messages and ``data`` of the
seed); one subclass per catalog id names its family (``ddpm.py`` … ``ldm.py``).
Contracts:

* Validation (reactor thread, or a validation twin without the weights) is the
  declaration alone: the inputs of ``predict`` (:mod:`.inputs`) as
  :meth:`DiffusionModel.configure_inputs` constrains them after :meth:`setup`, the
  renamed params (``timesteps``, ``sampler``) and ``eta``'s rule (``only_when``:
  given with another scheduler, a 422; its default dropped). No torch.
* :meth:`DiffusionModel.setup` (loader thread) loads the family's pipeline
  (:func:`~.factory.load_family`; a ``ModelLoadError`` names the problem) and, with
  ``compile = true``, compiles the denoiser before the server turns ready.
* A run (worker thread) builds a fresh diffusers scheduler (``params.scheduler``),
  seeds a private ``torch.Generator`` (``params.seed``, or a fresh seed echoed in
  ``data.seed``), draws the initial noise of all ``num_images`` images from it and
  then drives the scheduler itself: ``set_timesteps``, then per step
  ``scale_model_input``, the denoiser (classifier-free guidance: 2B rows with the
  "no label" id), and ``step``; after every step it calls ``ctx.progress(step,
  total)`` and ``ctx.check_cancelled()`` (also once before the first step), so a
  cancelled run stops within one step. Latent pipelines decode ``latents /
  scaling_factor``. The loop lives in :mod:`.batching`: ``predict`` is a batch of one
  on the calling thread; with ``max_running_jobs > 1`` the server steps the
  instance's runs together (:meth:`DiffusionModel.step_batch`, one denoiser call per
  step for all of them, at most ``max_batch_images`` rows each; the SDK adapter hands
  it to the server, ``sdk/step_batching.py``).
* Determinism: same params (seed included), same device, dtype and thread count ->
  the same PNG bytes for a run alone; in a batch, the same images within the
  tolerance measured in docs/models/diffusion.md. The shared networks are
  read-only; a run keeps its own state (scheduler object, generator, latents).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.codec import png_base64
from mortred_twisted.models.diffusion import inputs, schedulers
from mortred_twisted.models.diffusion.batching import DenoiseBatch, run_together
from mortred_twisted.models.diffusion.factory import FAMILIES, load_family
from mortred_twisted.models.diffusion.inputs import (
    RENAMED_PARAMS,
    SamplingPlan,
    resolve_seed,
)
from mortred_twisted.models.diffusion.pipeline import LoadedPipeline
from mortred_twisted.models.schemas import DIFFUSION_OUTPUT
from mortred_twisted.sdk import Context, Input, ServedModel

__all__ = ["RENAMED_PARAMS", "DiffusionModel", "SamplingPlan", "resolve_seed", "to_uint8"]


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``(B, C, H, W)`` in ``[-1, 1]`` -> ``(B, H, W)`` (C = 1) or ``(B, H, W, C)`` uint8."""
    pixels = ((images.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()
    return pixels[..., 0] if pixels.shape[-1] == 1 else pixels


class DiffusionModel(ServedModel):
    """A diffusion model over a diffusers pipeline (one instance per worker).

    Subclasses set :attr:`family` (a key of :data:`~.factory.FAMILIES`). After
    :meth:`setup`: ``pipe`` is shared and read-only; ``run_capacity`` is the
    ``max_running_jobs`` option (above 1 the instance has its own
    :class:`~.batching.DenoiseBatch`); ``max_batch_images`` caps the rows of one
    denoiser call.
    """

    contract = "mortred-v1"
    output_schema = DIFFUSION_OUTPUT
    renamed_inputs = RENAMED_PARAMS
    #: the catalog id this class serves
    family: ClassVar[str] = ""

    pipe: LoadedPipeline
    device: torch.device
    dtype: torch.dtype

    def setup(self) -> None:
        """Load the family's pipeline from the options; raises ``ModelLoadError``."""
        if self.family not in FAMILIES:
            raise ModelLoadError(
                f"{type(self).__name__} names no diffusion family (family = {self.family!r}; "
                f"one of {', '.join(FAMILIES)})"
            )
        loaded = load_family(self.family, self.options, self.root)
        opts = loaded.options
        pipe = self.pipe = loaded.pipe
        self.device = loaded.device
        self.dtype = loaded.dtype
        self._loaded = loaded
        self.clip = (
            bool(pipe.scheduler_config.get("clip_sample", False)) and pipe.autoencoder is None
        )
        self.prediction_type = str(pipe.scheduler_config.get("prediction_type", "epsilon"))
        self.channels_last = opts.channels_last
        #: The denoiser this instance calls (the shared one, or its compiled wrapper).
        self.net: torch.nn.Module = pipe.denoiser
        #: Seconds ``torch.compile`` and its first calls took at load (None: not compiled).
        self.compile_seconds: float | None = None
        #: A fresh scheduler per run, copied from one prepared per (name, steps).
        self.schedulers = schedulers.FreshSchedulers(pipe.scheduler_config, self.device)
        self.run_capacity = max(1, opts.max_running_jobs)
        self.max_batch_images = max(1, opts.max_batch_images)
        self._batch = DenoiseBatch(self, self.max_batch_images) if self.run_capacity > 1 else None
        if opts.compile:
            self.compile_denoiser()

    @property
    def num_classes(self) -> int | None:
        """The pipeline's classes for a class-conditional family, else None."""
        return self.pipe.num_classes if FAMILIES[self.family].conditional else None

    def configure_inputs(self) -> Mapping[str, Input]:
        """The params' defaults and bounds from the options and the pipeline."""
        loaded = self._loaded
        return inputs.configured(
            default_scheduler=loaded.options.scheduler,
            steps=loaded.steps,
            trained=loaded.trained,
            eta_default=loaded.options.eta,
            max_images=loaded.options.max_images,
            num_classes=self.num_classes,
            guidance=loaded.options.guidance_scale,
        )

    def predict(
        self,
        ctx: Context,
        scheduler: str = inputs.scheduler("ddim"),
        sample_steps: int = inputs.sample_steps(1000, inputs.MAX_STEPS_OPTION),
        eta: float = inputs.eta(0.0),
        seed: int = inputs.SEED,
        num_images: int = inputs.num_images(inputs.MAX_IMAGES_OPTION),
        predicted_x0: bool = inputs.PREDICTED_X0,
    ) -> dict[str, Any]:
        """Sample ``num_images`` images (see the module docstring)."""
        params = {
            "scheduler": scheduler, "sample_steps": sample_steps, "eta": eta, "seed": seed,
            "num_images": num_images, "predicted_x0": predicted_x0,
        }  # fmt: skip
        return self.sample(ctx, params)

    def sample(self, ctx: Context, params: Mapping[str, Any]) -> dict[str, Any]:
        """One run alone on the calling thread (a batch of one: the bytes of a run
        stepped alone in the server's batch); raises what ended it."""
        (outcome,) = run_together(self, [params], [ctx], self.max_batch_images)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def predict_together(
        self, ctxs: Sequence[Context], items: Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        """The sync path's dynamic batching (the server file's ``max_batch_size``):
        the requests stepped together in a private batch to the end, each with its
        own context (cancel, progress) and outcome."""
        return run_together(self, list(items), list(ctxs), self.max_batch_images)

    def step_batch(self) -> DenoiseBatch | None:
        """The instance's batch (the same one every call), or None at capacity 1."""
        return self._batch

    def plan(self, params: Mapping[str, Any]) -> SamplingPlan:
        """The run ``params`` (``predict``'s arguments, None when absent) ask for."""
        return inputs.plan(params, self.num_classes)

    def row_labels(self, plan: SamplingPlan) -> tuple[torch.Tensor | None, bool]:
        """The class label of each denoiser row of a run, and whether it is guided
        (guided: ``2B`` rows, the labels then the "no label" id)."""
        if plan.labels is None:
            return None, False
        y = torch.tensor(plan.labels, device=self.device, dtype=torch.long)
        null = torch.full_like(y, int(self.pipe.null_class_id or 0))
        s = plan.guidance_scale
        if s in (0.0, 1.0):
            return (null if s == 0.0 else y), False
        return torch.cat([y, null]), True

    def denoise(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        """One denoiser call over rows ``x`` at per-row timesteps ``t`` (float32).

        Learned-variance channels (DiT) are dropped; the output is float32.
        """
        channels = self.pipe.latent_shape[0]
        net = self.net
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if y is None:
            return net(x, t).sample[:, :channels].float()
        return net(x, t, class_labels=y).sample[:, :channels].float()

    def compile_denoiser(self) -> float:
        """``torch.compile`` this instance's denoiser (dynamic batch size) and run it
        on batches of 1 and 2 so that loading pays the compilation, not the first jobs.
        Loader thread. Returns (and keeps in ``compile_seconds``) the seconds taken."""
        started = time.perf_counter()
        self.net = torch.compile(self.pipe.denoiser, dynamic=True)
        conditional = self.pipe.num_classes > 0
        with torch.inference_mode():
            for rows in (1, 2):
                x = torch.zeros((rows, *self.pipe.latent_shape), device=self.device)
                t = torch.full((rows,), 1.0, device=self.device)
                y = torch.zeros(rows, dtype=torch.long, device=self.device) if conditional else None
                self.denoise(x.to(self.dtype), t, y)
        self.compile_seconds = time.perf_counter() - started
        return self.compile_seconds

    def x0(
        self, x: torch.Tensor, out: torch.Tensor, t: torch.Tensor, abar: torch.Tensor
    ) -> torch.Tensor:
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

    def decode_runs(self, latents: Sequence[torch.Tensor], max_rows: int) -> list[torch.Tensor]:
        """The images of finished runs (one latents tensor each, decoded alike).

        Latent pipelines decode runs together, consecutive runs sharing one
        autoencoder call while their rows fit in ``max_rows``; a run is never split
        (one larger than ``max_rows`` is one call), so a run alone is decoded exactly
        as before. Pixel pipelines return the latents as they are.
        """
        if self.pipe.autoencoder is None:
            return list(latents)
        groups: list[list[torch.Tensor]] = []
        rows = 0
        for z in latents:
            if groups and rows + z.shape[0] <= max_rows:
                groups[-1].append(z)
                rows += z.shape[0]
            else:
                groups.append([z])
                rows = z.shape[0]
        images: list[torch.Tensor] = []
        for group in groups:
            if len(group) == 1:
                images.append(self._decode(group[0]))
                continue
            images += self._decode(torch.cat(group)).split([z.shape[0] for z in group])
        return images

    def result(
        self,
        plan: SamplingPlan,
        steps: int,
        images: torch.Tensor,
        snapshots: list[tuple[int, int, torch.Tensor]],
    ) -> dict[str, Any]:
        """The envelope's ``data`` of a finished run from its decoded ``images``
        (:meth:`decode_runs`): PNG-encoded, with the run's parameters."""
        with torch.inference_mode():
            pixels = to_uint8(images)
            data: dict[str, Any] = {
                "images": [png_base64(p) for p in pixels],
                "width": int(pixels.shape[2]),
                "height": int(pixels.shape[1]),
                "channels": 1 if pixels.ndim == 3 else int(pixels.shape[3]),
                "steps": steps,
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
