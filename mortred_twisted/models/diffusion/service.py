"""The served diffusion model: option parsing, the run loop, the output ``data``.

The four families (``ddpm``, ``ddim``, ``cls_cond_ddim``, ``ldm``) are thin factories
over :class:`DiffusionModel`; they differ in the network, the params they accept and
how a request maps onto :func:`~mortred_twisted.models.diffusion.sampler.sample`.

Contracts (see :mod:`mortred_twisted.models.base`):

* ``create`` runs on a loader thread; every configuration or weights problem raises
  :class:`ModelLoadError` listing all problems found.
* :meth:`DiffusionModel.validate` (reactor thread) is the base class's declarative
  check plus cheap cross-field checks; it never touches torch.
* :meth:`DiffusionModel.run` (worker thread) seeds a private ``torch.Generator``
  (``params.seed``, or a fresh random seed that is echoed in ``data.seed``), samples
  the ``num_images`` images in one batch under ``torch.inference_mode()``, calls
  ``ctx.progress(step, total)`` after every step and ``ctx.check_cancelled()`` before
  the first and after every step, so a cancelled run stops within one step.
* Determinism: same params (seed included), same device and thread count -> the same
  PNG bytes. The shared networks are read-only; instances keep no per-run state.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mortred_twisted.models.base import (
    InferenceRequest,
    Model,
    ModelLoadError,
    RunContext,
)
from mortred_twisted.models.codec import png_base64
from mortred_twisted.models.diffusion.sampler import EpsFn, sample
from mortred_twisted.models.diffusion.schedule import NoiseSchedule, respace
from mortred_twisted.models.params import ParamSpec
from mortred_twisted.models.schemas import DIFFUSION_OUTPUT

MAX_SEED = 2**63 - 1
#: How many intermediate ``predicted_x0`` snapshots a DDIM run returns at most.
MAX_X0_SNAPSHOTS = 8


class OptionReader:
    """Typed access to a model's options, collecting every problem before raising."""

    def __init__(self, options: Mapping[str, Any], family: str) -> None:
        self.options = dict(options)
        self.family = family
        self.problems: list[str] = []
        self.used: set[str] = set()

    def get(
        self,
        key: str,
        kind: type,
        default: Any = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        choices: Sequence[Any] | None = None,
    ) -> Any:
        self.used.add(key)
        value = self.options.get(key, default)
        if value is None:
            self.problems.append(f"{key}: required")
            return default
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            self.problems.append(f"{key}: expected {kind.__name__}, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.problems.append(f"{key}: must be >= {minimum} (got {value})")
        if maximum is not None and value > maximum:
            self.problems.append(f"{key}: must be <= {maximum} (got {value})")
        if choices is not None and value not in choices:
            self.problems.append(f"{key}: must be one of {list(choices)} (got {value!r})")
        return value

    def finish(self) -> None:
        """Raise one :class:`ModelLoadError` naming every problem and unknown key."""
        unknown = sorted(set(self.options) - self.used)
        problems = list(self.problems)
        if unknown:
            problems.append(f"unknown keys {unknown}; accepted: {sorted(self.used)}")
        if problems:
            raise ModelLoadError(f"invalid {self.family} model options: " + "; ".join(problems))


def schedule_from_options(reader: OptionReader) -> NoiseSchedule:
    name = reader.get("beta_schedule", str, "cosine", choices=("linear", "cosine"))
    timesteps = reader.get("timesteps", int, 1000, minimum=1, maximum=100_000)
    beta_start = reader.get("beta_start", float, 1e-4, minimum=0.0, maximum=1.0)
    beta_end = reader.get("beta_end", float, 0.02, minimum=0.0, maximum=1.0)
    try:
        return NoiseSchedule.create(name, timesteps, beta_start, beta_end)
    except ValueError as exc:
        reader.problems.append(str(exc))
        return NoiseSchedule.create("cosine", 1000)


def check_trained_schedule(
    entry: Mapping[str, Any], schedule: NoiseSchedule, options: Mapping[str, Any]
) -> None:
    """Refuse a configured schedule that differs from the one the net was trained on."""
    trained = entry.get("schedule", {})
    mismatches = []
    if trained.get("beta_schedule") != schedule.name:
        mismatches.append(f"beta_schedule {schedule.name!r} vs {trained.get('beta_schedule')!r}")
    if trained.get("timesteps") != schedule.timesteps:
        mismatches.append(f"timesteps {schedule.timesteps} vs {trained.get('timesteps')}")
    if schedule.name == "linear":
        for key in ("beta_start", "beta_end"):
            if abs(float(options.get(key, 0.0)) - float(trained.get(key, -1.0))) > 1e-12:
                mismatches.append(f"{key} {options.get(key)} vs {trained.get(key)}")
    if mismatches:
        raise ModelLoadError(
            "configured noise schedule does not match the one the weights were "
            "trained with (configured vs trained): " + ", ".join(mismatches)
        )


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``(B, 1, H, W)`` in ``[-1, 1]`` -> ``(B, H, W)`` ``uint8`` (one host copy)."""
    pixels = ((images.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    return pixels[:, 0].cpu().numpy()


@dataclass(frozen=True)
class SamplingPlan:
    """What one run does, derived from the normalised params."""

    sampler: str
    steps: int
    eta: float
    num_images: int
    seed: int
    labels: list[int] | None = None
    guidance_scale: float = 1.0
    predicted_x0: bool = False


class DiffusionModel(Model):
    """One served diffusion model instance (owned by one worker).

    ``eps_net`` is shared and read-only. ``decode`` maps a sampled tensor (pixels or
    scaled latents) to images in ``[-1, 1]``; ``sample_shape`` is the per-image shape
    the sampler draws; ``clip_x0`` is the sampler's clamp on predicted ``x_0``.
    """

    uses_images = False
    output_schema = DIFFUSION_OUTPUT

    def __init__(
        self,
        *,
        family: str,
        eps_net: torch.nn.Module,
        schedule: NoiseSchedule,
        device: torch.device,
        params_schema: Sequence[ParamSpec],
        plan: Callable[[Mapping[str, Any]], SamplingPlan],
        sample_shape: tuple[int, int, int],
        image_size: int,
        decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
        clip_x0: float | None = 1.0,
        num_classes: int = 0,
    ) -> None:
        self.family = family
        self.eps_net = eps_net
        self.schedule = schedule
        self.device = device
        self.params_schema = tuple(params_schema)
        self._plan = plan
        self.sample_shape = sample_shape
        self.image_size = image_size
        self._decode = decode
        self.clip_x0 = clip_x0
        self.num_classes = num_classes

    def plan(self, params: Mapping[str, Any]) -> SamplingPlan:
        return self._plan(params)

    def _eps_fn(self, plan: SamplingPlan) -> EpsFn:
        net = self.eps_net
        if plan.labels is None:
            return lambda x, t: net(x, t)
        y = torch.tensor(plan.labels, device=self.device, dtype=torch.long)
        s = plan.guidance_scale
        if s == 1.0:
            return lambda x, t: net(x, t, y)
        null = torch.full_like(y, self.num_classes)
        if s == 0.0:
            return lambda x, t: net(x, t, null)
        both = torch.cat([y, null])

        def guided(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            eps_c, eps_u = net(torch.cat([x, x]), torch.cat([t, t]), both).chunk(2)
            return eps_u + s * (eps_c - eps_u)

        return guided

    def run(self, request: InferenceRequest, ctx: RunContext) -> dict[str, Any]:
        plan = self.plan(request.params)
        ctx.check_cancelled()
        ts = respace(self.schedule.timesteps, plan.steps)
        total = len(ts)
        snap_steps = (
            set(np.linspace(1, total, min(MAX_X0_SNAPSHOTS, total)).round().astype(int).tolist())
            if plan.predicted_x0
            else set()
        )
        snapshots: list[tuple[int, int, torch.Tensor]] = []

        def on_step(step: int, n: int, x0: torch.Tensor) -> None:
            if step in snap_steps:
                snapshots.append((step, ts[n - step], x0.clone()))
            ctx.progress(step, n)
            ctx.check_cancelled()

        generator = torch.Generator(device=self.device).manual_seed(plan.seed)
        with torch.inference_mode():
            eps_fn = self._eps_fn(plan)
            out = sample(
                eps_fn,
                (plan.num_images, *self.sample_shape),
                self.schedule,
                ts,
                sampler=plan.sampler,
                generator=generator,
                device=self.device,
                eta=plan.eta,
                clip_x0=self.clip_x0,
                on_step=on_step,
            )
            images = self._decode(out) if self._decode is not None else out
            pixels = to_uint8(images)
            data: dict[str, Any] = {
                "images": [png_base64(p) for p in pixels],
                "width": self.image_size,
                "height": self.image_size,
                "steps": total,
                "seed": plan.seed,
                "sampler": plan.sampler,
            }
            if plan.sampler == "ddim":
                data["eta"] = plan.eta
            if plan.labels is not None:
                data["class_ids"] = list(plan.labels)
                data["guidance_scale"] = plan.guidance_scale
            if plan.predicted_x0:
                data["predicted_x0"] = [
                    {
                        "step": step,
                        "timestep": t,
                        "images": [
                            png_base64(p)
                            for p in to_uint8(self._decode(x0) if self._decode else x0)
                        ],
                    }
                    for step, t, x0 in snapshots
                ]
        return data


def resolve_seed(params: Mapping[str, Any]) -> int:
    """The request's seed, or a fresh random one (echoed so the run can be replayed)."""
    seed = params.get("seed")
    return int(seed) if seed is not None else secrets.randbelow(2**31)


def common_params(max_images: int) -> list[ParamSpec]:
    return [
        ParamSpec(
            "seed",
            int,
            minimum=0,
            maximum=MAX_SEED,
            description="random seed; absent = a fresh one, echoed in data.seed",
        ),
        ParamSpec(
            "num_images",
            int,
            default=1,
            minimum=1,
            maximum=max_images,
            description="images sampled together in one batch",
        ),
    ]


def load_unet(
    reader: OptionReader, root: Any, device: torch.device, *, conditional: bool
) -> tuple[torch.nn.Module, Mapping[str, Any]]:
    """Load the verified denoiser named by option ``weights``; return ``(net, entry)``."""
    from mortred_twisted.models.diffusion.unet import UNet, UNetConfig
    from mortred_twisted.models.diffusion.weights import load_network, resolve_path

    path = resolve_path(reader.options.get("weights"), root, "weights")
    net, record = load_network(
        path,
        kind="unet",
        device=device,
        build=lambda entry: UNet(UNetConfig.from_dict(dict(entry["arch"]))),
    )
    num_classes = int(record.entry["arch"].get("num_classes", 0))
    if conditional != (num_classes > 0):
        want = "class-conditional" if conditional else "unconditional"
        raise ModelLoadError(f"{path.name} is not an {want} UNet (num_classes={num_classes})")
    return net, record.entry
