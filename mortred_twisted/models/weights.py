"""Verified weight loading and option helpers shared by the perception models (the
``mortred_v1`` adapters, the transformers tasks, YOLOV8).

Trained weights live under ``weights/perception/`` next to a ``manifest.json``::

    {"files": {"mobilenetv2_digits.pt": {"sha256": "…", "bytes": 123,
               "model_type": "MOBILENETV2", "command": "…", "figures": {…}}}}

Contract: :func:`load_verified_checkpoint` returns a checkpoint only if the file
exists, is listed in the manifest next to it, has the listed size and sha256, and
was trained for the expected model type. Anything else raises
:class:`~mortred_twisted.model_api.base.ModelLoadError` naming the file and the command
that rebuilds it: a server never starts with random or unverified weights.
Checkpoints are loaded with ``torch.load(weights_only=True)`` (no pickled code).

Also here: option helpers every perception ``create`` uses (paths relative to the
project root, device selection, class-name files). Called from loader threads only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mortred_twisted.model_api.base import ModelLoadError

MANIFEST_NAME = "manifest.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(manifest_path: Path) -> dict[str, Any]:
    """Parse a manifest; a missing or malformed one raises :class:`ModelLoadError`."""
    if not manifest_path.is_file():
        raise ModelLoadError(f"weights manifest not found: {manifest_path}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"weights manifest unreadable: {manifest_path}: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ModelLoadError(f"weights manifest has no 'files' table: {manifest_path}")
    return manifest


def write_manifest_entry(weights_path: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Record ``weights_path`` (sha256, size and ``entry``) in its folder's manifest.

    Used by the training scripts after saving weights; other entries are kept.
    Returns the entry written.
    """
    manifest_path = weights_path.parent / MANIFEST_NAME
    manifest: dict[str, Any] = {"files": {}}
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    record = dict(entry)
    record["sha256"] = sha256_file(weights_path)
    record["bytes"] = weights_path.stat().st_size
    manifest.setdefault("files", {})[weights_path.name] = record
    manifest["files"] = dict(sorted(manifest["files"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
    return record


def load_verified_checkpoint(weights_path: Path, model_type: str) -> dict[str, Any]:
    """Check ``weights_path`` against its manifest and return the loaded checkpoint.

    The checkpoint is a dict with at least ``arch`` (constructor keywords) and
    ``state_dict``. Raises :class:`ModelLoadError` on any mismatch.
    """
    manifest = read_manifest(weights_path.parent / MANIFEST_NAME)
    entry = manifest["files"].get(weights_path.name)
    if entry is None:
        raise ModelLoadError(
            f"weights {weights_path.name} are not listed in {weights_path.parent / MANIFEST_NAME}"
        )
    hint = f"; rebuild with: {entry.get('command', '(no command recorded)')}"
    if not weights_path.is_file():
        raise ModelLoadError(f"weights file not found: {weights_path}{hint}")
    if entry.get("model_type") not in (None, model_type):
        raise ModelLoadError(
            f"weights {weights_path.name} were trained for {entry.get('model_type')}, "
            f"not {model_type}"
        )
    size = weights_path.stat().st_size
    if entry.get("bytes") is not None and size != entry["bytes"]:
        raise ModelLoadError(
            f"weights {weights_path} are {size} bytes, manifest says {entry['bytes']}{hint}"
        )
    actual = sha256_file(weights_path)
    if actual != entry.get("sha256"):
        raise ModelLoadError(
            f"weights {weights_path} sha256 {actual[:12]}… does not match the manifest "
            f"({str(entry.get('sha256'))[:12]}…){hint}"
        )
    try:
        checkpoint = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read weights {weights_path}: {exc}") from exc
    if (
        not isinstance(checkpoint, dict)
        or "state_dict" not in checkpoint
        or "arch" not in checkpoint
    ):
        raise ModelLoadError(f"weights {weights_path} are not a perception checkpoint")
    return checkpoint


def load_state(module: torch.nn.Module, checkpoint: Mapping[str, Any], path: Path) -> None:
    """Load ``checkpoint['state_dict']`` strictly; a shape/key mismatch is a load error."""
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=True)
    except (RuntimeError, KeyError) as exc:
        raise ModelLoadError(f"weights {path} do not fit the architecture: {exc}") from exc
    module.eval()


def resolve_path(root: Path, value: Any, key: str) -> Path:
    """``value`` (a config string) as a path; relative paths are under ``root``."""
    if not isinstance(value, str) or not value:
        raise ModelLoadError(f"model option {key!r} must be a non-empty path string")
    path = Path(value)
    return path if path.is_absolute() else Path(root) / path


def resolve_device(value: Any) -> torch.device:
    """The torch device named by the ``device`` option (``cpu`` default, ``cuda[:N]``)."""
    name = "cpu" if value in (None, "") else str(value)
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelLoadError(f"invalid device {name!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unsupported device {name!r}; use 'cpu' or 'cuda'")
    return device


def read_class_names(path: Path, expected: int) -> list[str]:
    """One class name per non-empty line; the count must equal ``expected``."""
    if not path.is_file():
        raise ModelLoadError(f"class-name file not found: {path}")
    names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(names) != expected:
        raise ModelLoadError(
            f"class-name file {path} lists {len(names)} names; the weights have {expected} classes"
        )
    return names


def option(options: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    """Typed model option with a default; a wrong type raises :class:`ModelLoadError`."""
    value = options.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ModelLoadError(f"model option {key!r} must be {kind.__name__}, got {value!r}")
    return value
