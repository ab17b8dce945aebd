"""Model families by name, imported lazily.

The server TOML's ``[model] type`` picks an entry of
:data:`~mortred_twisted.model_api.builtins.MODEL_FACTORIES` (the table lives below
``models/`` and ``sdk/``, which both read it). Entries are ``module:attr``
strings so that importing the registry (and scanning twistd plugins) never imports
torch; the module is imported only when a server actually builds that model.
The attribute is a :class:`~mortred_twisted.sdk.ServedModel` class (a family declared
with the SDK, built by :func:`~mortred_twisted.sdk.loading.build_sdk_model`) or a
factory ``create(options: Mapping[str, Any], root: Path) -> Model``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.model_api.builtins import MODEL_ALIASES, MODEL_FACTORIES, SDK_TYPES
from mortred_twisted.model_api.input_limits import split_input_limits, takes_input_limits


def known_model_types() -> list[str]:
    return sorted(MODEL_FACTORIES)


def create_model(model_type: str, options: Mapping[str, Any], root: Path) -> Model:
    """Import the family of ``model_type`` and build one instance.

    The input limits (``max_images``, ``max_pixels``) are taken out of ``options``
    before the family sees them and set on the instance (``Model.input_limits``; the
    type's default when absent, see :mod:`mortred_twisted.model_api.input_limits`).

    Raises :class:`ModelLoadError` for an unknown type, a family that cannot be
    imported or a bad limit; the family's own loading errors propagate unchanged.
    """
    target = MODEL_FACTORIES.get(model_type)
    if target is None:  # a user's model: module:Class, file.py:Class or an entry point
        return create_sdk_model(model_type, options, root)
    refuse_entry_point_clash(model_type)
    refuse_alias_mix(model_type, options)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import model family {module_name}: {exc}") from exc
    factory = getattr(module, attr)
    served = _is_served_class(factory)
    limits = None
    if takes_input_limits(model_type):  # else its max_images is its own option
        try:
            limits, options = split_input_limits(model_type, options)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
    if served:  # a family declared with the SDK (issue 26.4)
        from mortred_twisted.sdk.loading import build_sdk_model

        return build_sdk_model(factory, options, root, input_limits=limits)
    model = factory(options, root)
    if limits is not None:
        model.input_limits = limits
    return model


def _is_served_class(target: Any) -> bool:
    from mortred_twisted.sdk.served import ServedModel

    return isinstance(target, type) and issubclass(target, ServedModel)


def refuse_entry_point_clash(model_type: str) -> None:
    """Refuse to start a built-in type that another installed package also registers
    (entry-point group ``mortred_twisted.models``): which one the operator meant is
    ambiguous, so the server stays not ready and says which package to rename."""
    from mortred_twisted.sdk.loading import entry_point_names

    other = entry_point_names().get(model_type)
    if other is not None:
        raise ModelLoadError(
            f"model type {model_type!r} is a built-in type, and an installed package also "
            f"registers it as an entry point ({other}); rename that entry point"
        )


def alias_expansion(model_type: str) -> str:
    """How the configuration a legacy type name stands for is written in a server
    file's ``[model]`` (``type = "transformers"`` + ``task`` + ``contract``)."""
    return ", ".join(f"{k} = {v!r}" for k, v in MODEL_ALIASES[model_type].items())


def refuse_alias_mix(model_type: str, options: Mapping[str, Any]) -> None:
    """A legacy type name (:data:`MODEL_ALIASES`) with keys of the configuration it
    stands for (``task``, ``contract``) is a load error saying what to write."""
    expansion = MODEL_ALIASES.get(model_type)
    if expansion is None:
        return
    mixed = sorted(k for k in options if k in expansion and k != "type")
    if mixed:
        raise ModelLoadError(
            f"type {model_type!r} is an alias of {alias_expansion(model_type)} and takes "
            f"no {', '.join(mixed)} of its own: write those keys instead of "
            f"type = {model_type!r}"
        )


def create_sdk_model(model_type: str, options: Mapping[str, Any], root: Path) -> Model:
    """A user's :class:`~mortred_twisted.sdk.ServedModel` built and set up (see
    :mod:`mortred_twisted.sdk.loading`); its input limits are the generic ones unless
    its options set ``max_images``/``max_pixels``."""
    from mortred_twisted.sdk.loading import build_sdk_model, load_served_class

    cls = load_served_class(model_type)
    try:
        limits, options = split_input_limits(model_type, options)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    return build_sdk_model(cls, options, root, input_limits=limits)


__all__ = [
    "MODEL_ALIASES",
    "MODEL_FACTORIES",
    "SDK_TYPES",
    "alias_expansion",
    "create_model",
    "create_sdk_model",
    "known_model_types",
    "refuse_entry_point_clash",
]
