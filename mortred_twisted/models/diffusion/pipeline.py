"""Load a diffusers pipeline directory for serving (loader thread; torch + diffusers).

A pipeline directory is what ``DiffusionPipeline.save_pretrained`` writes (and what a
checkpoint downloaded from a model hub looks like): ``model_index.json`` naming one
folder per component, each with ``config.json`` (``scheduler_config.json`` for the
scheduler) and its weights (``*.safetensors``, or ``*.bin`` for old checkpoints).
Served components:

* the denoiser, folder ``unet`` or ``transformer`` (``UNet2DModel``,
  ``DiTTransformer2DModel``, ``Transformer2DModel``), unconditional or
  class-conditional;
* an optional autoencoder, folder ``vqvae`` or ``vae`` (``VQModel``,
  ``AutoencoderKL``): the denoiser then works on latents that are divided by the
  autoencoder's ``scaling_factor`` and decoded, as diffusers' ``LDMPipeline`` and
  ``DiTPipeline`` do;
* ``scheduler``: only its configuration is read (the training noise schedule and
  prediction type); the sampler itself is chosen per request
  (:mod:`~mortred_twisted.models.diffusion.schedulers`).

Contract: :func:`load_pipeline` never reaches the network (``local_files_only`` and
``HF_HUB_OFFLINE``), checks every file it reads against the directory's sha256
manifest (:mod:`~mortred_twisted.models.diffusion.manifest`) before reading it, and
raises :class:`~mortred_twisted.model_api.base.ModelLoadError` naming the file on any
problem (missing, unlisted, tampered, unsupported component, unreadable weights).
Loaded pipelines are cached per ``(directory, device, dtype)`` so that the
``worker_nums`` instances of a server share one read-only copy.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusion.manifest import ManifestError, read_manifest, verify_files

DENOISER_FOLDERS = ("unet", "transformer")
AUTOENCODER_FOLDERS = ("vqvae", "vae")
DENOISER_CLASSES = ("UNet2DModel", "DiTTransformer2DModel", "Transformer2DModel")
AUTOENCODER_CLASSES = ("VQModel", "AutoencoderKL")
WEIGHT_SUFFIXES = (".safetensors", ".bin")

_CACHE: dict[tuple[str, str, str, str], LoadedPipeline] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class LoadedPipeline:
    """The verified, loaded components of one pipeline directory (read-only).

    ``num_classes`` is 0 for an unconditional denoiser; otherwise class ids are
    ``0..num_classes-1`` and ``null_class_id`` is the "no label" id used for
    classifier-free guidance. ``latent_shape`` is the per-image shape the sampler
    draws; ``learned_sigma``: the denoiser also outputs variance channels (DiT),
    which are dropped.
    """

    path: Path
    denoiser: torch.nn.Module
    denoiser_class: str
    autoencoder: torch.nn.Module | None
    scaling_factor: float
    scheduler_config: dict[str, Any]
    latent_shape: tuple[int, int, int]
    num_classes: int
    null_class_id: int | None
    learned_sigma: bool
    manifest: dict[str, Any]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device = 'cuda' but no CUDA device is available to torch")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def load_pipeline(
    path: Path,
    device: torch.device,
    dtype: torch.dtype,
    null_class_id: int | None = None,
    *,
    channels_last: bool = False,
) -> LoadedPipeline:
    """Verify and load the pipeline at ``path`` (cached; see the module contract).

    ``channels_last``: the denoiser's weights in channels-last memory format (its
    convolutions then take NHWC inputs; part of the cache key).
    """
    key = (str(path.resolve()), str(device), str(dtype), _stat_signature(path), channels_last)
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is None:
            cached = _load(path, device, dtype)
            if channels_last:
                cached.denoiser.to(memory_format=torch.channels_last)
            _CACHE[key] = cached
    if null_class_id is not None and cached.num_classes:
        return _with_null(cached, null_class_id)
    return cached


def _stat_signature(path: Path) -> str:
    """Sizes and mtimes of the directory's files: a rewritten file is loaded (and
    verified) again instead of being served from the cache."""
    if not path.is_dir():
        return ""
    return repr(
        sorted(
            (str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()
        )
    )


def _with_null(loaded: LoadedPipeline, null_id: int) -> LoadedPipeline:
    from dataclasses import replace

    return replace(loaded, null_class_id=null_id, num_classes=min(loaded.num_classes, null_id))


def read_index(path: Path) -> dict[str, tuple[str, str]]:
    """The components of ``model_index.json``: ``{folder: (library, class name)}``."""
    index_path = path / "model_index.json"
    if not path.is_dir():
        raise ModelLoadError(f"{path}: pipeline directory not found (model option 'pretrained')")
    if not index_path.is_file():
        raise ModelLoadError(f"{index_path}: missing file (not a diffusers pipeline directory)")
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{index_path}: unreadable ({exc})") from exc
    return {
        name: (str(value[0]), str(value[1]))
        for name, value in index.items()
        if not name.startswith("_")
        and isinstance(value, list)
        and len(value) == 2
        and value[0] is not None
        and value[1] is not None
    }


def _pick(components: dict[str, tuple[str, str]], folders: tuple[str, ...]) -> str | None:
    return next((f for f in folders if f in components), None)


def _needed_files(path: Path, manifest: dict[str, Any], folders: list[str]) -> list[str]:
    needed = ["model_index.json", "scheduler/scheduler_config.json"]
    listed = list(manifest["files"])
    for folder in folders:
        needed.append(f"{folder}/config.json")
        weights = {
            p.relative_to(path).as_posix()
            for p in (path / folder).glob("*")
            if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
        }
        weights |= {
            rel
            for rel in listed
            if rel.startswith(f"{folder}/")
            and rel.endswith(WEIGHT_SUFFIXES)
            and "/" not in rel[len(folder) + 1 :]
        }
        if not weights:
            raise ModelLoadError(f"{path / folder}: no weights file (*.safetensors or *.bin)")
        needed.extend(sorted(weights))
    return needed


def _load(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedPipeline:
    components = read_index(path)
    denoiser_folder = _pick(components, DENOISER_FOLDERS)
    ae_folder = _pick(components, AUTOENCODER_FOLDERS)
    if denoiser_folder is None:
        raise ModelLoadError(
            f"{path / 'model_index.json'}: no denoiser component (one of {DENOISER_FOLDERS})"
        )
    if "scheduler" not in components:
        raise ModelLoadError(f"{path / 'model_index.json'}: no 'scheduler' component")
    extra = sorted(set(components) - {denoiser_folder, ae_folder, "scheduler"})
    if extra:
        raise ModelLoadError(
            f"{path / 'model_index.json'}: unsupported components {extra} (served pipelines "
            "are unconditional or class-conditional: denoiser, scheduler, optional autoencoder)"
        )
    try:
        manifest = read_manifest(path)
        folders = [denoiser_folder] + ([ae_folder] if ae_folder else [])
        verify_files(path, manifest, _needed_files(path, manifest, folders))
    except ManifestError as exc:
        raise ModelLoadError(str(exc)) from exc
    scheduler_config = json.loads((path / "scheduler" / "scheduler_config.json").read_text())
    denoiser_class = components[denoiser_folder][1]
    denoiser = _load_model(path, denoiser_folder, components, DENOISER_CLASSES, device, dtype)
    autoencoder = (
        _load_model(path, ae_folder, components, AUTOENCODER_CLASSES, device, dtype)
        if ae_folder
        else None
    )
    return _describe(path, manifest, denoiser, denoiser_class, autoencoder, scheduler_config)


def _load_model(
    path: Path,
    folder: str,
    components: dict[str, tuple[str, str]],
    allowed: tuple[str, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> torch.nn.Module:
    library, class_name = components[folder]
    if library != "diffusers" or class_name not in allowed:
        raise ModelLoadError(
            f"{path / 'model_index.json'}: component {folder!r} is {library}.{class_name}; "
            f"supported: {', '.join(allowed)} (diffusers)"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import diffusers
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    cls = getattr(diffusers, class_name)
    try:
        model = cls.from_pretrained(path / folder, local_files_only=True, torch_dtype=dtype)
    except Exception as exc:  # diffusers raises many kinds; name the folder
        raise ModelLoadError(f"{path / folder}: cannot load {class_name}: {exc}") from exc
    model.to(device).eval()
    model.requires_grad_(False)
    return model


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _describe(
    path: Path,
    manifest: dict[str, Any],
    denoiser: torch.nn.Module,
    denoiser_class: str,
    autoencoder: torch.nn.Module | None,
    scheduler_config: dict[str, Any],
) -> LoadedPipeline:
    cfg = denoiser.config
    channels = int(cfg.in_channels)
    height, width = _size(cfg.sample_size)
    out_channels = int(getattr(cfg, "out_channels", None) or channels)
    num_classes, null_id = 0, None
    if denoiser_class == "UNet2DModel":
        if cfg.class_embed_type is not None:
            raise ModelLoadError(
                f"{path / 'unet/config.json'}: class_embed_type {cfg.class_embed_type!r} is "
                "not supported (class ids need num_class_embeds)"
            )
        if cfg.num_class_embeds:
            null_id = int(manifest.get("null_class_id", int(cfg.num_class_embeds) - 1))
            num_classes = null_id
    elif getattr(cfg, "num_embeds_ada_norm", None):
        num_classes = null_id = int(cfg.num_embeds_ada_norm)  # DiT: the extra row is "no label"
    scaling = 1.0
    if autoencoder is not None:
        scaling = float(getattr(autoencoder.config, "scaling_factor", 1.0) or 1.0)
    return LoadedPipeline(
        path=path,
        denoiser=denoiser,
        denoiser_class=denoiser_class,
        autoencoder=autoencoder,
        scaling_factor=scaling,
        scheduler_config={k: v for k, v in scheduler_config.items() if not k.startswith("_")},
        latent_shape=(channels, height, width),
        num_classes=num_classes,
        null_class_id=null_id,
        learned_sigma=out_channels == 2 * channels,
        manifest=manifest,
    )


def clear_cache() -> None:
    """Forget loaded pipelines (tests that rewrite a directory in place)."""
    with _LOCK:
        _CACHE.clear()
