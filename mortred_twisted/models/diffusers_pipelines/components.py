"""A diffusers pipeline directory: its kind, its parts, loaded (loader thread).

:func:`inspect_directory` reads ``model_index.json`` (no torch): the pipeline class
it names picks the kind (:data:`PIPELINE_CLASSES`), and every part that kind needs
(:data:`REQUIRED_PARTS`) must be named in the index and present as a folder with its
configuration; anything else is a :class:`ModelLoadError` naming the missing part
or the unknown class. :func:`load_pipeline` loads the directory with diffusers
(``local_files_only``: nothing is downloaded), places it on the device in the dtype
asked, applies the memory options and caches it per (directory, device, dtype,
options), so the ``worker_nums`` instances of one server share one read-only copy.
No safety checker runs (the SD classes are loaded with ``safety_checker=None``).
A directory that carries a sha256 ``manifest.json`` (ours do, see
``models/diffusion/manifest.py``) has every file checked against it before loading.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import ModelLoadError

#: pipeline class -> (its layout, the tasks it serves; the first is ``task = "auto"``)
PIPELINE_CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "StableDiffusionPipeline": ("sd", ("text-to-image", "image-to-image", "inpainting")),
    "StableDiffusionImg2ImgPipeline": ("sd", ("image-to-image", "text-to-image", "inpainting")),
    "StableDiffusionInpaintPipeline": ("sd", ("inpainting",)),
    "StableDiffusionXLPipeline": ("sdxl", ("text-to-image", "image-to-image", "inpainting")),
    "DiTPipeline": ("dit", ("class-conditional",)),
    "DDPMPipeline": ("pixel", ("unconditional",)),
    "DDIMPipeline": ("pixel", ("unconditional",)),
}
#: layout -> the parts (folders) it needs
REQUIRED_PARTS: dict[str, tuple[str, ...]] = {
    "sd": ("unet", "vae", "text_encoder", "tokenizer", "scheduler"),
    "sdxl": ("unet", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2",
             "scheduler"),
    "dit": ("transformer", "vae", "scheduler"),
    "pixel": ("unet", "scheduler"),
}  # fmt: skip
#: a part's folder must hold one of these (its configuration)
_CONFIG_FILES = ("config.json", "scheduler_config.json", "tokenizer_config.json",
                 "tokenizer.json", "vocab.json")  # fmt: skip


@dataclass(frozen=True)
class Directory:
    """What ``model_index.json`` says (see :func:`inspect_directory`)."""

    path: Path
    class_name: str
    layout: str
    tasks: tuple[str, ...]
    index: dict[str, Any]

    def task(self, asked: str) -> str:
        """The task served for option ``task = asked`` (``auto``: the class's own)."""
        if asked == "auto":
            return self.tasks[0]
        if asked not in self.tasks:
            raise ModelLoadError(
                f"{self.path}: task {asked!r} is not served by a {self.class_name} "
                f"(it serves {', '.join(self.tasks)})"
            )
        return asked


def inspect_directory(path: Path) -> Directory:
    """Read and check ``path`` (see the module docstring). No torch."""
    index_path = path / "model_index.json"
    if not path.is_dir():
        raise ModelLoadError(f"{path}: pipeline directory not found (model option 'path')")
    if not index_path.is_file():
        raise ModelLoadError(
            f"{path}: missing part 'model_index.json' (not a diffusers pipeline directory)"
        )
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{index_path}: unreadable ({exc})") from exc
    if not isinstance(index, dict):
        raise ModelLoadError(f"{index_path}: not a JSON object")
    class_name = str(index.get("_class_name", ""))
    known = PIPELINE_CLASSES.get(class_name)
    if known is None:
        raise ModelLoadError(
            f"{index_path}: unknown pipeline class {class_name!r}; served: "
            f"{', '.join(PIPELINE_CLASSES)}"
        )
    layout, tasks = known
    for part in REQUIRED_PARTS[layout]:
        entry = index.get(part)
        if not (isinstance(entry, list) and len(entry) == 2 and entry[1]):
            raise ModelLoadError(
                f"{path}: missing part {part!r}: model_index.json names none "
                f"(a {class_name} needs {', '.join(REQUIRED_PARTS[layout])})"
            )
        folder = path / part
        if not folder.is_dir():
            raise ModelLoadError(f"{path}: missing part {part!r}: folder {part}/ not found")
        if not any((folder / name).is_file() for name in _CONFIG_FILES):
            raise ModelLoadError(
                f"{path}: missing part {part!r}: {part}/ has no configuration "
                f"({' or '.join(_CONFIG_FILES[:3])})"
            )
    return Directory(path=path, class_name=class_name, layout=layout, tasks=tasks, index=index)


_CACHE: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def resolve_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def load_pipeline(
    directory: Directory,
    device: Any,
    dtype: Any,
    *,
    attention_slicing: bool = False,
    vae_tiling: bool = False,
) -> Any:
    """The directory's diffusers pipeline on ``device`` in ``dtype`` (cached, shared,
    read-only: callers never step its scheduler; see the module docstring)."""
    key = (str(directory.path.resolve()), str(device), str(dtype), attention_slicing, vae_tiling,
           _signature(directory.path))  # fmt: skip
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is None:
            cached = _CACHE[key] = _load(directory, device, dtype, attention_slicing, vae_tiling)
    return cached


def _signature(path: Path) -> tuple[Any, ...]:
    """Sizes and mtimes of the directory's files (a rewritten checkpoint loads again)."""
    return tuple(
        sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")
               if p.is_file())
    )  # fmt: skip


def verify_manifest(path: Path) -> None:
    """Check every file of ``path`` against its ``manifest.json`` when it has one."""
    from mortred_twisted.models.diffusion import manifest

    if not (path / manifest.MANIFEST_NAME).is_file():
        return
    try:
        manifest.verify_files(path, manifest.read_manifest(path), manifest.pipeline_files(path))
    except manifest.ManifestError as exc:
        raise ModelLoadError(str(exc)) from None


def _load(directory: Directory, device: Any, dtype: Any, slicing: bool, tiling: bool) -> Any:
    import diffusers

    verify_manifest(directory.path)

    extra: dict[str, Any] = {}
    if directory.layout == "sd":
        extra = {"safety_checker": None, "feature_extractor": None,
                 "requires_safety_checker": False}  # fmt: skip
    try:
        pipe = diffusers.DiffusionPipeline.from_pretrained(
            directory.path, local_files_only=True, dtype=dtype, **extra
        )
    except Exception as exc:
        raise ModelLoadError(
            f"{directory.path}: loading the {directory.class_name} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    if slicing and hasattr(pipe, "enable_attention_slicing"):
        pipe.enable_attention_slicing()
    if tiling and getattr(pipe, "vae", None) is not None:
        pipe.vae.enable_tiling()
    for module in pipe.components.values():
        if hasattr(module, "eval") and hasattr(module, "parameters"):
            module.eval()
            module.requires_grad_(False)
    return pipe
