"""The control-plane configuration ``conf/mortred.toml``: schema and loading (pure).

Three tables (contract § Supervisor)::

    [supervisor]   api_host, api_port, autostart_default, start_concurrency, log_dir,
                   log_rotate_mb, log_keep, catalog_dir, stop_grace_s, ready_timeout_s,
                   probe_interval_ms, restart_policy
    [gateway]      enabled, host, port, request_size_limit_mb, max_connections,
                   upstream_send_timeout_ms, upstream_recv_timeout_ms, api_keys,
                   max_persistent_per_host
    [gateway.upstreams]  <id> = ["http://host:port", …]  remote replicas of a model id
    [servers.<id>] enabled, autostart, restart_policy, port, replicas, and autoscaling
                   (max_replicas turns it on): min_replicas, max_replicas,
                   target_backlog_per_replica, scale_up_window_s, scale_down_window_s,
                   idle_to_zero_s, max_step, cooldown_s, autoscale_interval_s,
                   cold_start_max_waiting, cold_start_timeout_s

Every problem is collected and raised together as :class:`ConfigErrors`; unknown keys
are errors with "did you mean". Relative paths are resolved against the project root
(:func:`~mortred_twisted.config.server.find_root`: the parent of the nearest ``conf/``
folder above the file, else the file's own folder; never the working directory).
Secrets never live here: tokens come from the environment (``MORTRED_API_TOKEN``,
``MORTRED_GATEWAY_AUTH_TOKEN``, ``MORTRED_INTERNAL_TOKEN``, ``MORTRED_METRICS_TOKEN``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mortred_twisted.config.errors import ConfigErrors, check_value, did_you_mean
from mortred_twisted.config.server import find_root

RESTART_POLICIES = ("on-failure", "always", "no")


@dataclass(frozen=True)
class SupervisorSettings:
    """``[supervisor]``: the management API and process lifecycle knobs."""

    api_host: str = "127.0.0.1"
    api_port: int = 8787
    autostart_default: bool = True
    start_concurrency: int = 2
    log_dir: str = "logs"
    log_rotate_mb: float = 10.0
    log_keep: int = 3
    catalog_dir: str = "conf/server"
    stop_grace_s: float = 10.0
    ready_timeout_s: float = 600.0
    probe_interval_ms: int = 500
    restart_policy: str = "on-failure"
    #: seconds for a request's head and body to arrive (408 after); 0 = none
    read_timeout_s: float = 60.0
    #: seconds a keep-alive connection may stay silent between requests; 0 = none
    idle_timeout_s: float = 60.0


@dataclass(frozen=True)
class GatewaySettings:
    """``[gateway]``: the public entry point. Times are milliseconds."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8080
    request_size_limit_mb: float = 16.0
    max_connections: int = 1024
    max_connections_per_client: int = 64  # per client address; 0 = no cap
    body_budget_mb: float = 256.0  # request bodies held at once; 0 = no budget
    upstream_send_timeout_ms: int = 30000
    upstream_recv_timeout_ms: int = 180000
    api_keys: str = "conf/api_keys.toml"
    max_persistent_per_host: int = 64

    @property
    def request_size_limit_bytes(self) -> int:
        return int(self.request_size_limit_mb * 1024 * 1024)

    @property
    def body_budget_bytes(self) -> int:
        return int(self.body_budget_mb * 1024 * 1024)


@dataclass(frozen=True)
class AutoscaleSettings:
    """Autoscaling of one model id (``[servers.<id>]`` with ``max_replicas``; the
    policy is :mod:`mortred_twisted.supervisor.autoscale`, docs/configuration.md).

    Times are seconds. ``max_step`` 0 = no limit per decision. The cold-start
    bounds are the gateway's: at most ``cold_start_max_waiting`` requests of this id
    held while its first replica starts, each for at most ``cold_start_timeout_s``.
    """

    min_replicas: int = 1
    max_replicas: int = 1
    target_backlog_per_replica: float = 4.0
    scale_up_window_s: float = 2.0
    scale_down_window_s: float = 60.0
    idle_to_zero_s: float = 300.0
    max_step: int = 0
    cooldown_s: float = 5.0
    interval_s: float = 1.0
    cold_start_max_waiting: int = 64
    cold_start_timeout_s: float = 60.0

    def problems(self, where: str) -> list[str]:
        """What is inconsistent between the keys (each key's own range is checked by
        the schema)."""
        if self.max_replicas < max(self.min_replicas, 1):
            return [
                f"{where}: max_replicas ({self.max_replicas}) must be >= min_replicas "
                f"({self.min_replicas}) and >= 1"
            ]
        return []

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


#: ``[servers.<id>]`` key -> AutoscaleSettings field (the same name but one).
AUTOSCALE_KEYS = {
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "target_backlog_per_replica": "target_backlog_per_replica",
    "scale_up_window_s": "scale_up_window_s",
    "scale_down_window_s": "scale_down_window_s",
    "idle_to_zero_s": "idle_to_zero_s",
    "max_step": "max_step",
    "cooldown_s": "cooldown_s",
    "autoscale_interval_s": "interval_s",
    "cold_start_max_waiting": "cold_start_max_waiting",
    "cold_start_timeout_s": "cold_start_timeout_s",
}


@dataclass(frozen=True)
class ServerOverride:
    """``[servers.<id>]``: per-server overrides of the catalog defaults.

    ``None`` means "not set here": the supervisor default applies.
    """

    enabled: bool = True
    autostart: bool | None = None
    restart_policy: str | None = None
    port: int | None = None
    replicas: int | None = None
    #: autoscaling (``max_replicas`` set); None: a fixed count (``replicas``)
    autoscale: AutoscaleSettings | None = None


@dataclass(frozen=True)
class ControlConfig:
    """The whole validated ``conf/mortred.toml``; ``root`` is the project root."""

    supervisor: SupervisorSettings = field(default_factory=SupervisorSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    servers: Mapping[str, ServerOverride] = field(default_factory=dict)
    #: ``[gateway.upstreams]``: model id -> base URLs of remote replicas
    upstreams: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    root: str = "."
    source: str = "<defaults>"

    def path(self, relative: str) -> Path:
        """``relative`` resolved against the project root (absolute paths unchanged)."""
        return Path(self.root) / relative


_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    SupervisorSettings: {
        "api_host": (str,),
        "api_port": (int,),
        "autostart_default": (bool,),
        "start_concurrency": (int,),
        "log_dir": (str,),
        "log_rotate_mb": (int, float),
        "log_keep": (int,),
        "catalog_dir": (str,),
        "stop_grace_s": (int, float),
        "ready_timeout_s": (int, float),
        "probe_interval_ms": (int,),
        "restart_policy": (str,),
        "read_timeout_s": (int, float),
        "idle_timeout_s": (int, float),
    },
    GatewaySettings: {
        "enabled": (bool,),
        "host": (str,),
        "port": (int,),
        "request_size_limit_mb": (int, float),
        "max_connections": (int,),
        "max_connections_per_client": (int,),
        "body_budget_mb": (int, float),
        "upstream_send_timeout_ms": (int,),
        "upstream_recv_timeout_ms": (int,),
        "api_keys": (str,),
        "max_persistent_per_host": (int,),
    },
    ServerOverride: {
        "enabled": (bool,),
        "autostart": (bool,),
        "restart_policy": (str,),
        "port": (int,),
        "replicas": (int,),
        "min_replicas": (int,),
        "max_replicas": (int,),
        "target_backlog_per_replica": (int, float),
        "scale_up_window_s": (int, float),
        "scale_down_window_s": (int, float),
        "idle_to_zero_s": (int, float),
        "max_step": (int,),
        "cooldown_s": (int, float),
        "autoscale_interval_s": (int, float),
        "cold_start_max_waiting": (int,),
        "cold_start_timeout_s": (int, float),
    },
}

_RANGES: dict[str, tuple[float, float | None]] = {
    "api_port": (0, 65535),
    "port": (0, 65535),
    "start_concurrency": (1, 64),
    "log_rotate_mb": (0.001, None),
    "log_keep": (0, 100),
    "stop_grace_s": (0, None),
    "ready_timeout_s": (1, None),
    "probe_interval_ms": (10, None),
    "read_timeout_s": (0, None),
    "idle_timeout_s": (0, None),
    "request_size_limit_mb": (0.001, 4096),
    "max_connections": (1, None),
    "max_connections_per_client": (0, None),
    "body_budget_mb": (0, 1048576),
    "upstream_send_timeout_ms": (1, None),
    "upstream_recv_timeout_ms": (1, None),
    "max_persistent_per_host": (1, 10000),
    "replicas": (1, 64),
    "min_replicas": (0, 64),
    "max_replicas": (1, 64),
    "target_backlog_per_replica": (0.01, None),
    "scale_up_window_s": (0, 86400),
    "scale_down_window_s": (0, 86400),
    "idle_to_zero_s": (0, None),
    "max_step": (0, 64),
    "cooldown_s": (0, 86400),
    "autoscale_interval_s": (0.05, 3600),
    "cold_start_max_waiting": (0, 100000),
    "cold_start_timeout_s": (0.1, 3600),
}


def _section(cls: type, table: Any, where: str, problems: list[str]) -> dict[str, Any]:
    """Checked keyword arguments for ``cls`` from a TOML table."""
    if not isinstance(table, Mapping):
        problems.append(f"{where}: expected a table")
        return {}
    types = _TYPES[cls]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in types:
            problems.append(f"{where}.{key}: unknown key{did_you_mean(key, types)}")
            continue
        bounds = _RANGES.get(key, (None, None))
        if not check_value(f"{where}.{key}", value, types[key], bounds, problems):  # type: ignore[arg-type]
            continue
        if key == "restart_policy" and value not in RESTART_POLICIES:
            problems.append(
                f"{where}.{key}: must be one of {', '.join(RESTART_POLICIES)} "
                f"(got {value!r}){did_you_mean(value, RESTART_POLICIES)}"
            )
            continue
        values[key] = value
    return values


def _autoscale(values: dict[str, Any], where: str, problems: list[str]) -> AutoscaleSettings | None:
    """Pops the autoscale keys out of a ``[servers.<id>]`` table's checked values:
    the settings when ``max_replicas`` is given, else None (the other keys alone,
    or with ``replicas``, are problems)."""
    given = {AUTOSCALE_KEYS[k]: values.pop(k) for k in list(values) if k in AUTOSCALE_KEYS}
    if not given:
        return None
    if "max_replicas" not in given:
        names = ", ".join(sorted(k for k, f in AUTOSCALE_KEYS.items() if f in given))
        problems.append(f"{where}: {names} need max_replicas (autoscaling is on with it)")
        return None
    if values.get("replicas") is not None:
        problems.append(
            f"{where}: replicas is a fixed count; with autoscaling give min_replicas "
            "and max_replicas instead"
        )
        return None
    settings = AutoscaleSettings(**given)
    problems.extend(settings.problems(where))
    return settings


def _upstreams(table: Any, problems: list[str]) -> dict[str, tuple[str, ...]]:
    """``[gateway.upstreams]``: id -> list of ``http://host:port`` base URLs."""
    if not isinstance(table, Mapping):
        problems.append("gateway.upstreams: expected a table of id = [urls]")
        return {}
    result: dict[str, tuple[str, ...]] = {}
    for model_id, urls in table.items():
        where = f"gateway.upstreams.{model_id}"
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            problems.append(f"{where}: expected a list of URLs")
            continue
        bad = [u for u in urls if not _is_base_url(u)]
        if bad:
            problems.append(f"{where}: not an http://host:port URL: {', '.join(bad)}")
            continue
        result[model_id] = tuple(u.rstrip("/") for u in urls)
    return result


def _is_base_url(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return (
        parts.scheme == "http"
        and bool(parts.hostname)
        and port is not None
        and parts.path in ("", "/")
        and not parts.query
    )


def build_control_config(
    document: Mapping[str, Any], *, source: str = "<memory>", root: Path | None = None
) -> ControlConfig:
    """Validate a parsed ``mortred.toml`` document; raises :class:`ConfigErrors`."""
    problems: list[str] = []
    known_tables = ("supervisor", "gateway", "servers")
    for table in document:
        if table not in known_tables:
            problems.append(f"unknown table [{table}]{did_you_mean(table, known_tables)}")
    sup = _section(SupervisorSettings, document.get("supervisor", {}), "supervisor", problems)
    gw_table = document.get("gateway", {})
    upstreams: dict[str, tuple[str, ...]] = {}
    if isinstance(gw_table, Mapping) and "upstreams" in gw_table:
        gw_table = dict(gw_table)
        upstreams = _upstreams(gw_table.pop("upstreams"), problems)
    gw = _section(GatewaySettings, gw_table, "gateway", problems)
    servers: dict[str, ServerOverride] = {}
    raw_servers = document.get("servers", {})
    if not isinstance(raw_servers, Mapping):
        problems.append("servers: expected a table of [servers.<id>] tables")
        raw_servers = {}
    for server_id, table in raw_servers.items():
        where = f"servers.{server_id}"
        values = _section(ServerOverride, table, where, problems)
        values["autoscale"] = _autoscale(values, where, problems)
        servers[server_id] = ServerOverride(**values)
    if problems:
        raise ConfigErrors(source, problems)
    return ControlConfig(
        supervisor=SupervisorSettings(**sup),
        gateway=GatewaySettings(**gw),
        servers=MappingProxyType(servers),
        upstreams=MappingProxyType(upstreams),
        root=str((root or Path(".")).resolve()),
        source=source,
    )


def load_control_config(path: str | Path, *, root: Path | None = None) -> ControlConfig:
    """Read and validate ``conf/mortred.toml``; see :func:`build_control_config`."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigErrors(str(path), ["file not found"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors(str(path), [f"invalid TOML: {exc}"]) from None
    return build_control_config(document, source=str(path), root=root or find_root(path))


def with_overrides(config: ControlConfig, **sections: Mapping[str, Any]) -> ControlConfig:
    """A copy of ``config`` with keys of ``supervisor``/``gateway`` replaced.

    Used by command-line options (``--api-port``, ``--gateway-port``); values are not
    re-validated beyond their field names.
    """
    changes: dict[str, Any] = {}
    for name, values in sections.items():
        current = getattr(config, name)
        allowed = {f.name for f in fields(current)}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown {name} keys: {sorted(unknown)}")
        changes[name] = replace(current, **values)
    return replace(config, **changes)
