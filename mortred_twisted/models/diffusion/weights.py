"""Loading trained weights: manifest lookup, sha256 verification, strict state dicts.

A weights file ``<dir>/<name>.pt`` is only loaded if ``<dir>/manifest.json`` has an
entry ``files[<name>.pt]`` whose ``sha256`` matches the file's bytes. The entry also
carries the architecture (``arch``) and, for denoisers, the noise schedule the network
was trained with. Every problem (missing file, no manifest entry, checksum mismatch,
unreadable file, state dict that does not fit the architecture, kind mismatch) raises
:class:`~mortred_twisted.models.base.ModelLoadError` with the path and what to do:
a server never runs on random weights.

Loaded networks are cached per ``(path, sha256, device)`` so that the ``worker_nums``
instances of one server share one immutable copy; the cache is guarded by a lock
(``create`` runs on loader threads).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mortred_twisted.models.base import ModelLoadError

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class WeightsRecord:
    """A verified weights file and its manifest entry."""

    path: Path
    sha256: str
    entry: Mapping[str, Any]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_path(value: Any, root: Path, key: str) -> Path:
    """``root / value`` for a relative path from a model config (``key`` names it)."""
    if not isinstance(value, str) or not value:
        raise ModelLoadError(f"model config key {key!r} must be a non-empty path string")
    path = Path(value)
    return path if path.is_absolute() else Path(root) / path


def verify(path: Path, *, kind: str) -> WeightsRecord:
    """Check that ``path`` exists and matches its manifest entry of ``kind``."""
    if not path.is_file():
        raise ModelLoadError(
            f"weights file {path} is missing; train it with the command recorded in "
            f"{path.parent / MANIFEST_NAME} (see docs/models/diffusion.md)"
        )
    manifest_path = path.parent / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(
            f"no {MANIFEST_NAME} next to {path}: cannot verify the weights"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {manifest_path}: {exc}") from exc
    entry = manifest.get("files", {}).get(path.name) if isinstance(manifest, dict) else None
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{manifest_path} has no entry for {path.name}")
    if entry.get("kind") != kind:
        raise ModelLoadError(
            f"{path.name} is a {entry.get('kind')!r} weights file, expected {kind!r}"
        )
    digest = sha256_file(path)
    if digest != entry.get("sha256"):
        raise ModelLoadError(
            f"sha256 mismatch for {path}: file is {digest}, manifest says "
            f"{entry.get('sha256')}; the file is corrupt or was replaced without "
            "updating the manifest"
        )
    return WeightsRecord(path=path, sha256=digest, entry=entry)


def load_state(record: WeightsRecord) -> dict[str, torch.Tensor]:
    """Read a verified file as a tensor-only state dict (``weights_only``)."""
    try:
        state = torch.load(record.path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling failure is a load error
        raise ModelLoadError(f"cannot read weights {record.path}: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{record.path} does not hold a state dict of tensors")
    return state


_cache: dict[tuple[str, str, str], nn.Module] = {}
_cache_lock = threading.Lock()


def load_network(
    path: Path,
    *,
    kind: str,
    device: torch.device,
    build: Callable[[Mapping[str, Any]], nn.Module],
) -> tuple[nn.Module, WeightsRecord]:
    """Verify ``path``, build the network from its manifest entry, load it strictly.

    ``build(entry)`` constructs the (untrained) module from the manifest entry and
    raises ``ValueError``/``TypeError`` for an architecture it does not accept.
    Returns the module in ``eval()`` mode on ``device``, gradients disabled; callers
    must treat it as read-only (it is shared).
    """
    record = verify(path, kind=kind)
    key = (str(path.resolve()), record.sha256, str(device))
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None:
            return cached, record
        try:
            net = build(record.entry)
        except (ValueError, TypeError, KeyError) as exc:
            raise ModelLoadError(
                f"bad architecture in manifest entry of {path.name}: {exc}"
            ) from exc
        state = load_state(record)
        try:
            net.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ModelLoadError(
                f"weights {path} do not match the architecture in the manifest: {exc}"
            ) from exc
        net.to(device).eval()
        for p in net.parameters():
            p.requires_grad_(False)
        _cache[key] = net
        return net, record


def pick_device(value: Any) -> torch.device:
    """``"auto"`` -> CUDA when available else CPU; ``"cpu"``; ``"cuda"`` (must exist)."""
    if value in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if value == "cpu":
        return torch.device("cpu")
    if isinstance(value, str) and value.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {value!r} configured but CUDA is not available")
        return torch.device(value)
    raise ModelLoadError(f"model config key 'device' must be auto, cpu or cuda (got {value!r})")
