"""What every ``type = "transformers"`` task shares: the directory, its parts, batching.

A task model is a :class:`~mortred_twisted.sdk.ServedModel` whose ``setup`` calls
:func:`load_parts` with its ``AutoModelFor…`` class. Contract:

* the directory is ``options["pretrained"]`` (relative to the model's root); it must
  hold ``config.json``, the weights (``model.safetensors``, a sharded
  ``model.safetensors.index.json`` or ``pytorch_model.bin``) and the image processor's
  ``preprocessor_config.json``; a missing part is a
  :class:`~mortred_twisted.model_api.base.ModelLoadError` naming it
  (:func:`check_directory`);
* everything is read with ``local_files_only=True``: nothing is downloaded; the image
  processor is the PIL one (torchvision is not needed);
* the network (eval mode, on ``device``) and processor are loaded once per process
  and directory and shared read-only by the workers (:data:`_SHARED`);
* :func:`forward_groups` runs the network over several pictures in as few calls as
  their preprocessed shapes allow (one when the processor resizes to a fixed size).

Called from the loader thread (``setup``) and the worker threads (``predict``).
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import InvalidRequest, ModelLoadError

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
#: The options every task takes (the mask generator adds the AMG keys).
COMMON_OPTIONS = frozenset({"pretrained", "task", "device"})

_lock = threading.Lock()
_SHARED: dict[tuple[str, str, str], Parts] = {}


@dataclass(frozen=True)
class Parts:
    """A loaded directory: the network, its image processor, its config."""

    directory: Path
    model: Any
    processor: Any
    config: Any
    device: Any


def directory_of(options: Mapping[str, Any], root: Path) -> Path:
    """The ``pretrained`` directory named by ``options`` (relative to ``root``)."""
    from mortred_twisted.models.weights import resolve_path

    if "pretrained" not in options:
        raise ModelLoadError(
            'model type "transformers" needs pretrained = "<checkpoint directory>"'
        )
    return resolve_path(root, options["pretrained"], "pretrained")


def read_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of ``directory`` as a dict (ModelLoadError naming what is wrong)."""
    if not directory.is_dir():
        raise ModelLoadError(f"pretrained directory not found: {directory}")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ModelLoadError(f"{directory}: {CONFIG_FILE} missing (not a transformers directory)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelLoadError(f"{path}: not a JSON object")
    return doc


def check_directory(directory: Path, extra: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
    """Raise ModelLoadError naming the first missing part: the config, the weights,
    the image processor, or one of ``extra`` (``(what, any of these files)``)."""
    read_config(directory)
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise ModelLoadError(f"{directory}: weights missing (none of {', '.join(WEIGHT_FILES)})")
    if not (directory / PREPROCESSOR_FILE).is_file():
        raise ModelLoadError(f"{directory}: {PREPROCESSOR_FILE} (the image processor) missing")
    for what, names in extra:
        if not any((directory / name).is_file() for name in names):
            raise ModelLoadError(f"{directory}: {what} missing (none of {', '.join(names)})")


def check_options(options: Mapping[str, Any], known: frozenset[str]) -> None:
    unknown = set(options) - known
    if unknown:
        raise ModelLoadError(
            f"unknown model option(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
        )


def quiet() -> None:
    """Keep transformers' notices and progress bars out of the server's log."""
    from mortred_twisted.models.pretrained import quiet_transformers

    quiet_transformers()


def load_parts(
    options: Mapping[str, Any],
    root: Path,
    auto_class: str,
    *,
    extra: Sequence[tuple[str, Sequence[str]]] = (),
    processor: Callable[[Path], Any] | None = None,
) -> Parts:
    """The network (``transformers.<auto_class>``) and processor of the directory
    ``options`` names, shared per process (see the module docstring)."""
    import transformers

    from mortred_twisted.models.pretrained import load_processor
    from mortred_twisted.models.weights import resolve_device

    directory = directory_of(options, root)
    device = resolve_device(options.get("device", "cpu"))
    key = (str(directory.resolve()), str(device), auto_class)
    with _lock:
        found = _SHARED.get(key)
        if found is not None:
            return found
        check_directory(directory, extra)
        quiet()
        loader = getattr(transformers, auto_class)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = loader.from_pretrained(str(directory), local_files_only=True)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                raise ModelLoadError(
                    f"{directory}: cannot load {auto_class}: {type(exc).__name__}: {exc}"
                ) from exc
        made = (processor or load_processor)(directory)
        model = model.eval().to(device)
        found = _SHARED[key] = Parts(directory, model, made, model.config, device)
        return found


def label_names(config: Any) -> list[str]:
    """``id2label`` as a list indexed by class id (ModelLoadError unless 0..N-1)."""
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if not id2label or sorted(id2label) != list(range(len(id2label))):
        raise ModelLoadError(f"config id2label is not 0..N-1: {sorted(id2label)[:10]}")
    return [id2label[i] for i in range(len(id2label))]


def forward_groups(
    parts: Parts, pictures: Sequence[Any], call: Callable[[dict[str, Any]], Any]
) -> list[Any]:
    """``call(batch)`` over the processed ``pictures`` (PIL), grouped by tensor shape
    so that one call serves every picture of a shape; returns ``call``'s result and
    the row of each picture as ``(output, row)`` in picture order."""
    import torch

    if len(pictures) > 1 and fixed_size(parts.processor):  # one call, one group
        inputs = parts.processor(images=list(pictures), return_tensors="pt")
        batch = {k: v.to(parts.device) for k, v in inputs.items() if torch.is_tensor(v)}
        with torch.inference_mode():
            out = call(batch)
        return [(out, row) for row in range(len(pictures))]
    processed = [parts.processor(images=[p], return_tensors="pt") for p in pictures]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, inputs in enumerate(processed):
        shape = tuple((k, tuple(v.shape)) for k, v in inputs.items() if torch.is_tensor(v))
        groups.setdefault(shape, []).append(i)
    placed: list[Any] = [None] * len(pictures)
    for rows in groups.values():
        batch = {
            key: torch.cat([processed[i][key] for i in rows]).to(parts.device)
            for key, value in processed[rows[0]].items()
            if torch.is_tensor(value)
        }
        with torch.inference_mode():
            out = call(batch)
        for r, i in enumerate(rows):
            placed[i] = (out, r)
    return placed


def fixed_size(processor: Any) -> bool:
    """Whether ``processor`` turns every picture into a tensor of one shape, each on
    its own (a fixed resize or centre crop, no padding to the batch): then one call
    over several pictures equals the per-picture calls stacked, at ~1/N of the
    Python calls (measured: 8 RT-DETR pictures, 15,745 -> 12,239 calls)."""
    if getattr(processor, "do_pad", False):
        return False
    crop = getattr(processor, "crop_size", None) or {}
    if getattr(processor, "do_center_crop", False) and "height" in crop and "width" in crop:
        return True
    size = getattr(processor, "size", None) or {}
    return bool(getattr(processor, "do_resize", False)) and "height" in size and "width" in size


def decode_each(items: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[BaseException | None]]:
    """Each item's ``image`` decoded to RGB (PIL); an item whose picture does not
    decode gets its exception (it fails alone) and ``None`` as its picture."""
    pictures: list[Any] = []
    errors: list[BaseException | None] = []
    for item in items:
        try:
            pictures.append(item["image"].to_pil("RGB"))
            errors.append(None)
        except Exception as exc:  # InputDecodeError: a 400 for this item only
            pictures.append(None)
            errors.append(exc)
    return pictures, errors


def run_items(
    items: Sequence[Mapping[str, Any]],
    batch: Callable[[list[Any], list[Mapping[str, Any]]], list[Any]],
) -> list[Any]:
    """Decode every item, call ``batch(pictures, items)`` over the good ones, and
    answer one entry per item (an output or that item's exception)."""
    pictures, errors = decode_each(items)
    good = [i for i, e in enumerate(errors) if e is None]
    answers: list[Any] = list(errors)
    if good:
        try:
            outs = batch([pictures[i] for i in good], [items[i] for i in good])
        except Exception as exc:
            outs = [exc] * len(good)
        for i, out in zip(good, outs, strict=True):
            answers[i] = out
    return answers


def bounded(name: str, value: int | None, limit: int) -> int:
    """``value`` capped at ``limit`` (None: ``limit``); InvalidRequest when below 1."""
    if value is None:
        return limit
    if value < 1:
        raise InvalidRequest(f"params.{name}", "must be at least 1")
    return min(value, limit)
