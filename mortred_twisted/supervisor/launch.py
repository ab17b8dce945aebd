"""``python -m mortred_twisted.supervisor.launch [twistd options] <plugin> [plugin options]``.

Runs twistd exactly as ``twistd`` does, but with the three mortred ServiceMakers
given here instead of discovered through ``twisted/plugins``. The supervisor spawns
children this way so a child always runs the same code as the supervisor (a working
tree, or an editable install where twistd cannot see the plugin file), and never a
stale installed copy. ``twistd -n mortred-model …`` after a regular install is
equivalent.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from twisted.application import app
from twisted.application.service import ServiceMaker
from twisted.scripts.twistd import ServerOptions, runApp

#: Mirrors ``twisted_plugins/mortred_plugins.py``.
SERVICE_MAKERS = (
    ServiceMaker(
        "mortred-model",
        "mortred_twisted.tap.model_server",
        "A mortred model server (sync /infer and async /jobs).",
        "mortred-model",
    ),
    ServiceMaker(
        "mortred-gateway",
        "mortred_twisted.tap.gateway",
        "The mortred gateway: auth, routing and URL rewriting to model servers.",
        "mortred-gateway",
    ),
    ServiceMaker(
        "mortred-supervisor",
        "mortred_twisted.tap.supervisor",
        "The mortred supervisor: catalog, process lifecycle, status, logs, web UI.",
        "mortred-supervisor",
    ),
)


class LaunchOptions(ServerOptions):  # type: ignore[misc]
    """twistd's options with the mortred plugins only."""

    @staticmethod
    def _getPlugins(interface: Any, package: Any = None) -> Iterable[Any]:
        return SERVICE_MAKERS


def main() -> None:
    if os.environ.get("MORTRED_PARENT_DEATH_SIGNAL") == "1":
        from mortred_twisted.supervisor.process import set_parent_death_signal

        set_parent_death_signal()
    app.run(runApp, LaunchOptions)


if __name__ == "__main__":
    main()
