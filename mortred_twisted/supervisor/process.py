"""Child processes: what to run (pure specs) and running it (``spawnProcess``).

Children are the twistd plugins, run through :mod:`mortred_twisted.supervisor.launch`
(``twistd`` with the mortred ServiceMakers) by the supervisor's own interpreter, in
the foreground (``--nodaemon``), without a pid file, logging to stdout, which this
module captures into the child's :class:`~mortred_twisted.supervisor.logs.LogBuffer`.

``MORTRED_PARENT_DEATH_SIGNAL=1`` asks the launcher to put the child in its own
process group (so a terminal's Ctrl-C reaches only the supervisor, which then stops
children in order), to have the kernel send it SIGTERM if the supervisor dies, and
to exit at once if the supervisor (``MORTRED_SUPERVISOR_PID``, set at each spawn)
is already gone (:func:`~mortred_twisted.supervisor.child_contract.guard_parent`).
Each spawn also gets its own ``MORTRED_SPAWN_KEY`` (the child proves it holds it
when probed: :mod:`~mortred_twisted.supervisor.child_contract`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from twisted.internet import defer
from twisted.internet.protocol import ProcessProtocol

from mortred_twisted.config.catalog import CatalogEntry
from mortred_twisted.config.control import ControlConfig
from mortred_twisted.supervisor.child_contract import (
    PARENT_DEATH_ENV,
    SPAWN_KEY_ENV,
    SUPERVISOR_PID_ENV,
)
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.policy import ExitStatus

LAUNCHER = ("-m", "mortred_twisted.supervisor.launch", "--nodaemon", "--pidfile=")

#: Variables a child never inherits from the supervisor: each child gets exactly the
#: tokens meant for it.
_SECRETS = (
    "MORTRED_API_TOKEN",
    "MORTRED_GATEWAY_AUTH_TOKEN",
    "MORTRED_INTERNAL_TOKEN",
    "MORTRED_AUTH_TOKEN",
    "MORTRED_METRICS_TOKEN",
    "MORTRED_LISTEN_HOST",
    "MORTRED_LISTEN_PORT",
    SPAWN_KEY_ENV,
    SUPERVISOR_PID_ENV,
)


@dataclass(frozen=True)
class ProcessSpec:
    """How to run one child."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "."


def _package_parent() -> str:
    import mortred_twisted

    return str(Path(mortred_twisted.__file__).resolve().parent.parent)


def base_env(parent_env: Mapping[str, str]) -> dict[str, str]:
    """The supervisor's environment minus secrets, with the package importable."""
    env = {k: v for k, v in parent_env.items() if k not in _SECRETS}
    paths = [_package_parent()]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env[PARENT_DEATH_ENV] = "1"
    return env


def model_spec(
    entry: CatalogEntry,
    control: ControlConfig,
    internal_token: str,
    parent_env: Mapping[str, str],
    python: str = sys.executable,
    replica: int = 0,
) -> ProcessSpec:
    """``twistd -n mortred-model --config <toml>`` with the listen/auth overrides;
    replica ``n`` (0-based) of an id listens on ``port + n``."""
    env = base_env(parent_env)
    env["MORTRED_LISTEN_HOST"] = entry.host
    env["MORTRED_LISTEN_PORT"] = str(entry.port + replica if entry.port else 0)
    if internal_token:
        env["MORTRED_AUTH_TOKEN"] = internal_token
    config = entry.config_path or str(Path(control.root) / entry.source)
    argv = (python, *LAUNCHER, "mortred-model", "--config", config)
    return ProcessSpec(argv, env, control.root)


def gateway_spec(
    control: ControlConfig,
    *,
    auth_token: str,
    internal_token: str,
    parent_env: Mapping[str, str],
    python: str = sys.executable,
) -> ProcessSpec:
    """``twistd -n mortred-gateway --config <mortred.toml> --host H --port P
    --supervisor-url U``: the address, port and supervisor API of ``control`` (with
    the supervisor's command-line overrides: the child does not re-read them from
    the file)."""
    env = base_env(parent_env)
    env["MORTRED_GATEWAY_AUTH_TOKEN"] = auth_token
    env["MORTRED_INTERNAL_TOKEN"] = internal_token
    if parent_env.get("MORTRED_METRICS_TOKEN"):
        env["MORTRED_METRICS_TOKEN"] = parent_env["MORTRED_METRICS_TOKEN"]
    gw = control.gateway
    argv = (
        python,
        *LAUNCHER,
        "mortred-gateway",
        "--config",
        str(Path(control.source).resolve()),
        "--host",
        gw.host,
        "--port",
        str(gw.port),
        "--supervisor-url",
        supervisor_url(control),
    )
    return ProcessSpec(argv, env, control.root)


def supervisor_url(control: ControlConfig) -> str:
    """``http://host:port`` of the supervisor's API as its children reach it (a
    wildcard listen address is reached on loopback)."""
    sup = control.supervisor
    host = "127.0.0.1" if sup.api_host in ("0.0.0.0", "") else sup.api_host
    host = "::1" if host == "::" else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{sup.api_port}"


class ChildHandle(Protocol):
    """A running child: its pid, a way to signal it, and its end."""

    pid: int | None
    ended: defer.Deferred[ExitStatus]

    def signal(self, name: str) -> None: ...


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec, log: LogBuffer) -> ChildHandle: ...


class _ChildProtocol(ProcessProtocol):
    """Captures output into the log and turns the end into an :class:`ExitStatus`."""

    def __init__(self, log: LogBuffer) -> None:
        self.log = log
        self.ended: defer.Deferred[ExitStatus] = defer.Deferred()
        self.pid: int | None = None

    def outReceived(self, data: bytes) -> None:
        self.log.append(data)

    def errReceived(self, data: bytes) -> None:
        self.log.append(data)

    def processEnded(self, reason: Any) -> None:
        value = reason.value
        self.log.flush_partial()
        self.pid = None
        self.ended.callback(
            ExitStatus(code=getattr(value, "exitCode", None), signal=getattr(value, "signal", None))
        )

    def signal(self, name: str) -> None:
        if self.transport is not None and self.pid is not None:
            # ProcessExitedAlready: it is gone, which is what the caller wanted.
            with contextlib.suppress(Exception):
                self.transport.signalProcess(name)


class ReactorSpawner:
    """Spawns with ``reactor.spawnProcess``; stdin is closed, stdout/stderr captured."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor

    def spawn(self, spec: ProcessSpec, log: LogBuffer) -> ChildHandle:
        proto = _ChildProtocol(log)
        env = dict(spec.env)
        env[SUPERVISOR_PID_ENV] = str(os.getpid())  # at spawn: twistd may have forked
        transport = self.reactor.spawnProcess(
            proto,
            spec.argv[0],
            list(spec.argv),
            env=env,
            path=spec.cwd,
            childFDs={0: "w", 1: "r", 2: "r"},
        )
        proto.pid = transport.pid
        transport.closeStdin()
        return proto
