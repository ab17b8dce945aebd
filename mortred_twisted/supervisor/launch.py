"""``python -m mortred_twisted.supervisor.launch [twistd options] <plugin> [plugin options]``.

Runs twistd exactly as ``twistd`` does, but with the mortred ServiceMakers of this
code base given here instead of discovered through ``twisted/plugins``. The
supervisor spawns children this way so a child always runs the same code as the
supervisor (a working tree, or an editable install where twistd cannot see the
plugin file), and never a stale installed copy. ``twistd -n mortred-model …`` after
a regular install is equivalent.

The ServiceMakers are read from the one plugin file, ``twisted_plugins/mortred_plugins.py``
next to this package in a source tree, else its installed copy
``twisted.plugins.mortred_plugins`` (a regular install puts it there, beside this
package): a plugin added there is launchable here too.

A supervised child guards its parent first of all, before twistd and the code base
are imported (:func:`~mortred_twisted.supervisor.child_contract.guard_parent`:
parent-death signal, then a check that the parent is still the supervisor).
"""

from __future__ import annotations

if __name__ == "__main__":  # a child: nothing heavy is imported before this runs
    from mortred_twisted.supervisor.child_contract import guard_parent

    guard_parent()

import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from twisted.application import app
from twisted.application.service import ServiceMaker
from twisted.scripts.twistd import ServerOptions, runApp

#: The plugin file in a source tree (the checkout this package was imported from).
SOURCE_PLUGINS = Path(__file__).resolve().parents[2] / "twisted_plugins" / "mortred_plugins.py"
INSTALLED_PLUGINS = "twisted.plugins.mortred_plugins"


def plugin_module(source: Path = SOURCE_PLUGINS) -> ModuleType:
    """The mortred plugin module of this code base: ``source`` when it exists, else
    the installed copy. Raises ImportError when there is neither."""
    if not source.is_file():
        return importlib.import_module(INSTALLED_PLUGINS)
    spec = importlib.util.spec_from_file_location("_mortred_plugins", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def service_makers(module: ModuleType) -> tuple[ServiceMaker, ...]:
    """The ServiceMakers a plugin module defines, in definition order."""
    return tuple(v for v in vars(module).values() if isinstance(v, ServiceMaker))


SERVICE_MAKERS = service_makers(plugin_module())


class LaunchOptions(ServerOptions):  # type: ignore[misc]
    """twistd's options with the mortred plugins only."""

    @staticmethod
    def _getPlugins(interface: Any, package: Any = None) -> Iterable[Any]:
        return SERVICE_MAKERS


def main() -> None:
    app.run(runApp, LaunchOptions)


if __name__ == "__main__":
    main()
