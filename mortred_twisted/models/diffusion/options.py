"""Model options of the diffusion family (``conf/model/diffusion/*.toml``); pure.

Keys (any may be overridden in the server TOML's ``[model]`` table):

* ``pretrained`` (required): the diffusers pipeline directory, relative to the project
  root or absolute;
* ``device``: ``auto`` (CUDA when available) | ``cpu`` | ``cuda``;
* ``dtype``: ``float32`` | ``float16`` | ``bfloat16`` (half types only on CUDA);
* ``scheduler``, ``sample_steps``, ``eta``, ``guidance_scale``: the request defaults;
* ``max_images``: the bound on ``params.num_images``;
* ``max_running_jobs``: how many runs (jobs and sync requests) an instance steps
  together, its slots in the worker pool (1 = one run at a time on its own thread);
* ``max_batch_images``: the most rows (images; guided images count twice) one
  denoiser call takes; a step over more rows makes several calls;
* ``channels_last``: run the denoiser in channels-last memory format;
* ``compile``: ``torch.compile`` the denoiser at load (opt-in; compiling takes
  minutes on a CPU and is paid before the server turns ready);
* ``null_class_id``: class-conditional UNets only, the "no label" id (default: the
  manifest's ``null_class_id``, else ``num_class_embeds - 1``).

Keys of the hand-written models that preceded diffusers are refused with a message
saying what replaced them. Every problem is collected and reported at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusion.schedulers import NAMES

DTYPES = ("float32", "float16", "bfloat16")
#: Defaults of the step-batching keys (docs/models/diffusion.md, "Step batching").
DEFAULT_RUNNING_JOBS = 8
DEFAULT_BATCH_IMAGES = 32
DEFAULT_CHANNELS_LAST = True
#: Keys of the previous model options and what replaced them.
REPLACED_OPTIONS = {
    "weights": "'pretrained' (a diffusers pipeline directory)",
    "autoencoder": "the pipeline's own 'vqvae'/'vae' component under 'pretrained'",
    "beta_schedule": "the pipeline's scheduler/scheduler_config.json",
    "timesteps": "the pipeline's scheduler/scheduler_config.json (num_train_timesteps)",
    "beta_start": "the pipeline's scheduler/scheduler_config.json",
    "beta_end": "the pipeline's scheduler/scheduler_config.json",
    "latent_dims": "the autoencoder's config.json",
    "downscale": "the autoencoder's config.json",
    "latent_scale": "the autoencoder's config.json (scaling_factor)",
    "latent_clip": "v-prediction in the shipped LDM (no clamp needed)",
    "sampler": "'scheduler'",
}


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
        required: bool = False,
    ) -> Any:
        self.used.add(key)
        value = self.options.get(key, default)
        if value is None:
            if required:
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
        problems = list(self.problems)
        for key in sorted(set(self.options) - self.used):
            if key in REPLACED_OPTIONS:
                problems.append(f"{key}: no longer read; replaced by {REPLACED_OPTIONS[key]}")
            else:
                problems.append(f"{key}: unknown key; accepted: {sorted(self.used)}")
        if problems:
            raise ModelLoadError(f"invalid {self.family} model options: " + "; ".join(problems))


@dataclass(frozen=True)
class DiffusionOptions:
    """The checked options of one diffusion model."""

    pretrained: Path
    device: str
    dtype: str
    scheduler: str
    sample_steps: int | None
    eta: float
    guidance_scale: float
    max_images: int
    null_class_id: int | None
    max_running_jobs: int = 1
    max_batch_images: int = 32
    channels_last: bool = False
    compile: bool = False


def read_options(
    options: Mapping[str, Any], family: str, root: Path, *, default_scheduler: str
) -> DiffusionOptions:
    """Check ``options``; raise one ``ModelLoadError`` listing every problem.

    ``sample_steps`` may be absent (``None``): the pipeline's number of train
    timesteps is then the default.
    """
    reader = OptionReader(options, family)
    pretrained = reader.get("pretrained", str, required=True)
    device = reader.get("device", str, "auto", choices=("auto", "cpu", "cuda"))
    dtype = reader.get("dtype", str, "float32", choices=DTYPES)
    scheduler = reader.get("scheduler", str, default_scheduler, choices=NAMES)
    sample_steps = reader.get("sample_steps", int, None, minimum=1, maximum=100_000)
    eta = reader.get("eta", float, 0.0, minimum=0.0, maximum=1.0)
    guidance = reader.get("guidance_scale", float, 2.0, minimum=0.0, maximum=20.0)
    max_images = reader.get("max_images", int, 16, minimum=1, maximum=256)
    null_class_id = reader.get("null_class_id", int, None, minimum=0)
    running = reader.get("max_running_jobs", int, DEFAULT_RUNNING_JOBS, minimum=1, maximum=256)
    rows = reader.get("max_batch_images", int, DEFAULT_BATCH_IMAGES, minimum=1, maximum=4096)
    channels_last = reader.get("channels_last", bool, DEFAULT_CHANNELS_LAST)
    compile_ = reader.get("compile", bool, False)
    if dtype != "float32" and device == "cpu":
        reader.problems.append(f"dtype: {dtype!r} needs device 'cuda' (CPU runs float32)")
    reader.finish()
    path = Path(pretrained)
    return DiffusionOptions(
        pretrained=path if path.is_absolute() else Path(root) / path,
        device=device,
        dtype=dtype,
        scheduler=scheduler,
        sample_steps=sample_steps,
        eta=eta,
        guidance_scale=guidance,
        max_images=max_images,
        null_class_id=null_class_id,
        max_running_jobs=running,
        max_batch_images=rows,
        channels_last=channels_last,
        compile=compile_,
    )
