"""Finding and building a user's model from ``[model] type`` (load time, off the reactor).

A type names one of:

* a built-in family (``DDPM``, ``SAM_AMG``, …: ``models/registry.py``);
* ``package.module:Class``: an importable module;
* ``path/to/file.py:Class``: a Python file (a relative path is taken from the folder
  of the server file that names it; the config resolves it, see
  :func:`is_file_target`);
* a name an installed package registers in the entry-point group
  :data:`ENTRY_POINT_GROUP` (``[project.entry-points."mortred_twisted.models"]``).
  Names are listed from the packages' metadata without importing them
  (:func:`entry_point_names`); a name that clashes with a built-in type is refused.

:func:`load_served_class` imports the target and checks that it is a
:class:`~mortred_twisted.sdk.served.ServedModel` subclass; :func:`build_sdk_model`
makes one instance, sets its options and root, runs ``setup`` and wraps it in a
:class:`~mortred_twisted.sdk.adapter.SdkModel`. Every failure is a
:class:`~mortred_twisted.model_api.base.ModelLoadError` naming the type and the reason
(an import error keeps its traceback as its cause, for the log).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.config.server import is_file_target
from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.sdk.declaration import Declaration, declare

ENTRY_POINT_GROUP = "mortred_twisted.models"

_lock = threading.Lock()
_declarations: dict[type, Declaration] = {}


def is_import_target(model_type: str) -> bool:
    module, sep, attr = model_type.rpartition(":")
    return bool(sep and module and attr) and not module.endswith(".py")


#: The distribution whose entry points are the built-in families themselves.
OWN_DISTRIBUTION = "mortred-twisted"


def entry_point_names() -> dict[str, str]:
    """Model names other packages register → ``module:attr`` (read from metadata;
    nothing imported). This package's own entry points (the built-in families) are
    left out: they are the registry's names."""
    found: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is not None and _normalise(dist.metadata["Name"] or "") == OWN_DISTRIBUTION:
            continue
        found.setdefault(ep.name, ep.value)
    return found


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _import_file(path: Path, model_type: str) -> Any:
    if not path.is_file():
        raise ModelLoadError(f"model type {model_type!r}: file not found: {path}")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"mortred_user_models.{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"model type {model_type!r}: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def resolve_target(model_type: str, base: Path | None = None) -> str:
    """``model_type`` as ``module:attr`` or ``/abs/file.py:attr`` (entry points looked
    up; a relative file taken from ``base``). Raises ModelLoadError."""
    if is_file_target(model_type):
        file, _, attr = model_type.rpartition(":")
        path = Path(file)
        if not path.is_absolute():
            path = (base or Path(".")) / path
        return f"{path}:{attr}"
    if is_import_target(model_type):
        return model_type
    from mortred_twisted.model_api.builtins import MODEL_FACTORIES

    registered = entry_point_names()
    if model_type in registered:
        if model_type in MODEL_FACTORIES:
            raise ModelLoadError(
                f"model type {model_type!r}: an installed package registers it as an "
                "entry point, but it is a built-in type; rename the entry point"
            )
        return registered[model_type]
    builtin = MODEL_FACTORIES.get(model_type)
    if builtin is not None:  # a built-in family (the harness, mortredctl model check)
        return builtin
    known = sorted(set(MODEL_FACTORIES) | set(registered))
    raise ModelLoadError(
        f"unknown model type {model_type!r}; known: {', '.join(known)}; or give "
        "'package.module:Class' or 'path/to/file.py:Class'"
    )


def load_served_class(model_type: str, base: Path | None = None) -> type:
    """Import the class ``model_type`` names (see the module docstring)."""
    from mortred_twisted.sdk.served import ServedModel

    target = resolve_target(model_type, base)
    module_name, _, attr = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name), model_type)
        else:
            module = importlib.import_module(module_name)
    except ModelLoadError:
        raise
    except BaseException as exc:  # a SyntaxError, a missing dependency, an exit()
        raise ModelLoadError(
            f"model type {model_type!r}: importing {module_name} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ModelLoadError(f"model type {model_type!r}: {module_name} has no {attr!r}")
    if not (isinstance(obj, type) and issubclass(obj, ServedModel)):
        if target in _builtin_targets():
            raise ModelLoadError(
                f"model type {model_type!r} is a built-in loader of several declarations, "
                "not one declared class; name its class (package.module:Class)"
            )
        raise ModelLoadError(
            f"model type {model_type!r}: {attr} is not a mortred_twisted.sdk.ServedModel subclass"
        )
    return obj


def _builtin_targets() -> set[str]:
    from mortred_twisted.model_api.builtins import MODEL_FACTORIES

    return set(MODEL_FACTORIES.values())


def declaration_of(cls: type) -> Declaration:
    """``cls``'s declaration, read once per class (thread-safe)."""
    with _lock:
        found = _declarations.get(cls)
        if found is None:
            found = _declarations[cls] = declare(cls)
        return found


def build_sdk_model(
    cls: type,
    options: Mapping[str, Any],
    root: Path,
    *,
    input_limits: Any = None,
) -> Any:
    """One instance of ``cls`` set up and adapted (see the module docstring)."""
    from mortred_twisted.sdk.adapter import SdkModel

    declaration = declaration_of(cls)
    try:
        instance = cls()
        instance.options = dict(options)
        instance.root = Path(root)
        instance.setup()
        overrides = instance.configure_inputs()
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"model {declaration.name}: setup() failed: {type(exc).__name__}: {exc}"
        ) from exc
    if overrides:
        from mortred_twisted.sdk.constraints import refine

        declaration = refine(declaration, overrides)
    return SdkModel(declaration, instance, input_limits=input_limits)
