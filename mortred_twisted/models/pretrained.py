"""Verified transformers checkpoint directories for the perception families.

A served perception model (IMAGE_CLASSIFICATION, OBJECT_DETECTION, SAM_AMG) is a
directory in transformers' layout, named by ``pretrained = "…"`` in its model config::

    weights/perception/mobilenetv2/
        config.json                 architecture, id2label
        model.safetensors           weights
        preprocessor_config.json    the image processor (resize, rescale, normalise)
        manifest.json               sha256 and size of every file above (+ provenance)

Contract: :func:`verified_directory` returns the resolved directory only when each of
the files the loader reads exists, is listed in ``manifest.json`` and matches its size
and sha256 (the manifest format of the diffusion pipelines,
:mod:`mortred_twisted.models.diffusion.manifest`). Otherwise it raises
:class:`~mortred_twisted.model_api.base.ModelLoadError` naming the file; the server then
stays not ready. Loading uses ``local_files_only=True``: nothing is downloaded.

A checkpoint downloaded elsewhere (e.g. ``facebook/sam-vit-base``) is vetted once and
its manifest written with::

    .venv/bin/python -m mortred_twisted.models.pretrained DIR [DIR ...]

Called from loader threads only.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusion.manifest import (
    ManifestError,
    read_manifest,
    verify_files,
    write_manifest,
)
from mortred_twisted.models.weights import resolve_path

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
WEIGHT_FILES = ("model.safetensors",)
NEEDED_FILES = (CONFIG_FILE, WEIGHT_FILES[0], PREPROCESSOR_FILE)


def verified_directory(
    options: Mapping[str, Any], root: Path, default: str, model_type: str
) -> Path:
    """The ``pretrained`` directory of ``options``, checked against its manifest.

    ``default`` is used when the option is absent; relative paths are under ``root``.
    A manifest that records a ``model_type`` other than ``model_type`` is refused (the
    shipped directories record theirs; one written by the CLI records none).
    Raises :class:`ModelLoadError` on a missing directory, manifest or file, or a
    size/sha256 mismatch.
    """
    directory = resolve_path(root, options.get("pretrained", default), "pretrained")
    if not directory.is_dir():
        raise ModelLoadError(f"pretrained directory not found: {directory}")
    try:
        manifest = read_manifest(directory)
        verify_files(directory, manifest, list(NEEDED_FILES))
    except ManifestError as exc:
        raise ModelLoadError(f"{exc}; {_hint(directory, manifest_or_none(directory))}") from exc
    recorded = manifest.get("model_type")
    if recorded not in (None, model_type):
        raise ModelLoadError(f"{directory} was trained for {recorded}, not {model_type}")
    return directory


def manifest_or_none(directory: Path) -> Mapping[str, Any] | None:
    """The manifest of ``directory`` if it reads, else ``None`` (for error hints)."""
    try:
        return read_manifest(directory)
    except ManifestError:
        return None


def _hint(directory: Path, manifest: Mapping[str, Any] | None) -> str:
    command = (manifest or {}).get("command")
    if command:
        return f"rebuild with: {command}"
    return (
        "after vetting the files write the manifest with: .venv/bin/python -m "
        f"mortred_twisted.models.pretrained {directory}"
    )


def load_processor(directory: Path) -> Any:
    """The image processor of ``directory`` (PIL backend when torchvision is absent)."""
    from transformers import AutoImageProcessor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot load image processor from {directory}: {exc}") from exc


def quiet_transformers() -> None:
    """Keep transformers' fallback notices (no torchvision: PIL backend) and loading
    progress bars out of the server's log."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """CLI: write the manifest of each transformers directory given."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__)
        return 2
    for name in args:
        directory = Path(name)
        missing = [f for f in NEEDED_FILES if not (directory / f).is_file()]
        if missing:
            print(f"{directory}: missing {', '.join(missing)} (not a transformers directory)")
            return 1
        data = write_manifest(directory)
        print(f"{directory / 'manifest.json'}: {len(data['files'])} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
