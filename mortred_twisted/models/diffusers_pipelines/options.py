"""Model options of ``type = "diffusers"`` (pure; docs/configuration.md lists them).

Keys of the server file's ``[model]`` table:

* ``path`` (required): the pipeline directory (``model_index.json``), relative to the
  project root or absolute; read with local files only;
* ``task``: ``auto`` (from ``model_index.json``'s ``_class_name``) |
  ``text-to-image`` | ``image-to-image`` | ``inpainting`` (a Stable Diffusion
  checkpoint serves all three) | ``class-conditional`` | ``unconditional``;
* ``device``: ``auto`` (CUDA when available) | ``cpu`` | ``cuda``;
  ``dtype``: ``float32`` | ``float16`` | ``bfloat16`` (half types need CUDA; a CPU
  runs float32);
* ``attention_slicing``, ``vae_tiling``: diffusers' memory savers (off by default);
* ``scheduler``, ``sample_steps``, ``guidance_scale``: the request defaults;
* ``max_num_images``: the bound on ``params.num_images`` (``max_images`` is the
  input-limit key of image inputs, see model_api/input_limits.py);
* ``max_width``, ``max_height``: bounds on ``params.width``/``height`` (default: twice
  the checkpoint's native size);
* ``max_running_jobs``: text-to-image runs one instance steps together (its slots in
  the worker pool; 1 = one run at a time); ``max_batch_images``: the most UNet rows
  of one call (guided images count twice).

Every problem is collected and reported at once (a :class:`ModelLoadError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.models.diffusion.options import DTYPES, OptionReader
from mortred_twisted.models.diffusion.schedulers import NAMES

TASKS = (
    "auto",
    "text-to-image",
    "image-to-image",
    "inpainting",
    "class-conditional",
    "unconditional",
)
FAMILY = "diffusers"


@dataclass(frozen=True)
class PipelineOptions:
    """The checked options of one ``diffusers`` model."""

    path: Path
    task: str = "auto"
    device: str = "auto"
    dtype: str = "float32"
    attention_slicing: bool = False
    vae_tiling: bool = False
    scheduler: str = "dpmsolver++"
    sample_steps: int = 25
    guidance_scale: float | None = None
    max_num_images: int = 4
    max_width: int | None = None
    max_height: int | None = None
    max_running_jobs: int = 8
    max_batch_images: int = 32


def read_options(options: Mapping[str, Any], root: Path) -> PipelineOptions:
    """Check ``options`` (see the module docstring); raise one ``ModelLoadError``."""
    reader = OptionReader(options, FAMILY)
    path = reader.get("path", str, required=True)
    task = reader.get("task", str, "auto", choices=TASKS)
    device = reader.get("device", str, "auto", choices=("auto", "cpu", "cuda"))
    dtype = reader.get("dtype", str, "float32", choices=DTYPES)
    slicing = reader.get("attention_slicing", bool, False)
    tiling = reader.get("vae_tiling", bool, False)
    scheduler = reader.get("scheduler", str, "dpmsolver++", choices=NAMES)
    steps = reader.get("sample_steps", int, 25, minimum=1, maximum=1000)
    guidance = reader.get("guidance_scale", float, None, minimum=0.0, maximum=30.0)
    num_images = reader.get("max_num_images", int, 4, minimum=1, maximum=64)
    max_width = reader.get("max_width", int, None, minimum=8, maximum=8192)
    max_height = reader.get("max_height", int, None, minimum=8, maximum=8192)
    running = reader.get("max_running_jobs", int, 8, minimum=1, maximum=256)
    rows = reader.get("max_batch_images", int, 32, minimum=1, maximum=4096)
    if dtype != "float32" and device == "cpu":
        reader.problems.append(f"dtype: {dtype!r} needs device 'cuda' (CPU runs float32)")
    reader.finish()
    where = Path(path)
    return PipelineOptions(
        path=where if where.is_absolute() else Path(root) / where,
        task=task,
        device=device,
        dtype=dtype,
        attention_slicing=slicing,
        vae_tiling=tiling,
        scheduler=scheduler,
        sample_steps=steps,
        guidance_scale=guidance,
        max_num_images=num_images,
        max_width=max_width,
        max_height=max_height,
        max_running_jobs=running,
        max_batch_images=rows,
    )
