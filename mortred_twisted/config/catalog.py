"""The model catalog: every ``conf/server/**/*.toml``, checked as a whole (pure).

The supervisor and the gateway build the same catalog from the same files, so they
agree on ids, ports and URIs without talking to each other. ``[servers.<id>]`` tables
of ``conf/mortred.toml`` are applied on top (enabled, autostart, restart policy, port,
replicas or autoscaling, whose ``max_replicas`` ports are all reserved), and
``[gateway.upstreams]`` adds remote replicas of an id.

Invariants of a :class:`Catalog`: ids, ``host:port`` pairs (every replica's port:
``port … port+replicas-1``) and ``server_uri`` values are unique; a clash is a
startup error naming both files. An id served by more than one process (replicas or
remote upstreams) must use ``job_store = "redis"``: with the in-memory store each
process keeps its own jobs, so a poll answered by another replica would be a 404.
Server configs are read with an empty environment: ``MORTRED_*`` variables of the
supervisor's own environment must not leak into every model's entry.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mortred_twisted.config.control import AutoscaleSettings, ControlConfig
from mortred_twisted.config.errors import ConfigErrors, did_you_mean
from mortred_twisted.config.server import ServerConfig, build_server_config, find_root

#: Paths the gateway serves itself; a model's legacy ``server_uri`` may not shadow them.
RESERVED_PREFIXES = ("/v1/", "/healthz", "/metrics", "/api/", "/jobs")


@dataclass(frozen=True)
class CatalogEntry:
    """One model server as the control plane sees it (effective, overrides applied)."""

    id: str
    category: str
    host: str
    port: int
    server_uri: str
    async_enabled: bool
    request_size_limit_mb: float
    source: str  # the server TOML, relative to the project root when possible
    config_path: str = ""  # the server TOML, absolute (what the model process loads)
    model_type: str = "fake"
    enabled: bool = True
    autostart: bool = True
    restart_policy: str = "on-failure"
    job_store: str = "memory"
    replicas: int = 1
    remote_upstreams: tuple[str, ...] = ()
    #: autoscaling between min and max replicas (``replicas`` is then the max: every
    #: port the id may use); None: ``replicas`` is a fixed count
    autoscale: AutoscaleSettings | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the (first) model process (loopback when shipped)."""
        return self.replica_url(0)

    def replica_url(self, index: int) -> str:
        """``http://host:port+index``: the base URL of local replica ``index``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port + index if self.port else 0}"

    @property
    def upstream_urls(self) -> tuple[str, ...]:
        """Every process serving this id: the local replicas, then remote upstreams."""
        local = tuple(self.replica_url(i) for i in range(self.replicas))
        return local + self.remote_upstreams

    def to_json(self) -> dict[str, object]:
        """The public view used by ``GET /api/v1/catalog``."""
        return {
            "id": self.id,
            "category": self.category,
            "host": self.host,
            "port": self.port,
            "server_uri": self.server_uri,
            "async_enabled": self.async_enabled,
            "model_type": self.model_type,
            "enabled": self.enabled,
            "autostart": self.autostart,
            "restart_policy": self.restart_policy,
            "job_store": self.job_store,
            "replicas": self.replicas,
            "remote_upstreams": list(self.remote_upstreams),
            "autoscale": self.autoscale.to_json() if self.autoscale else None,
            "config": self.source,
        }


class Catalog(Mapping[str, CatalogEntry]):
    """An immutable, ordered id → entry mapping with a lookup by legacy URI."""

    def __init__(self, entries: list[CatalogEntry]) -> None:
        self._by_id = {e.id: e for e in entries}
        self._by_uri = {e.server_uri: e for e in entries}

    def __getitem__(self, key: str) -> CatalogEntry:
        return self._by_id[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def by_uri(self, uri: str) -> CatalogEntry | None:
        """The entry whose sync ``server_uri`` is exactly ``uri``, if any."""
        return self._by_uri.get(uri)

    def enabled(self) -> list[CatalogEntry]:
        return [e for e in self._by_id.values() if e.enabled]


def _load_entry_config(path: Path) -> ServerConfig:
    """A server TOML checked like the model server does, minus the model file (the
    control plane never needs it) and minus the environment."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors(str(path), [f"invalid TOML: {exc}"]) from None
    return build_server_config(
        document, source=str(path), root=find_root(path), env={}, read_model_file=False
    )


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def check_unique(entries: list[CatalogEntry]) -> list[str]:
    """Problems for duplicate ids, ports and URIs, each naming both files."""
    problems: list[str] = []
    seen: dict[str, dict[object, CatalogEntry]] = {"id": {}, "port": {}, "server_uri": {}}
    for entry in entries:
        keys: list[tuple[str, object]] = [("id", entry.id), ("server_uri", entry.server_uri)]
        keys += [("port", (entry.host, entry.port + i)) for i in range(entry.replicas)]
        for what, key in keys:
            if what == "port" and entry.port == 0:
                continue
            first = seen[what].get(key)
            if first is not None:
                shown = f"{key[0]}:{key[1]}" if isinstance(key, tuple) else repr(key)
                problems.append(
                    f"duplicate {what} {shown}: {first.source} ({first.id}) "
                    f"and {entry.source} ({entry.id})"
                )
            else:
                seen[what][key] = entry
    return problems


def discover(catalog_dir: Path, root: Path) -> tuple[list[CatalogEntry], list[str]]:
    """Load every ``*.toml`` under ``catalog_dir`` (sorted); entries and problems."""
    entries: list[CatalogEntry] = []
    problems: list[str] = []
    if not catalog_dir.is_dir():
        return [], [f"catalog directory not found: {catalog_dir}"]
    for path in sorted(catalog_dir.rglob("*.toml")):
        try:
            cfg = _load_entry_config(path)
        except ConfigErrors as exc:
            problems.extend(f"{_relative(path, root)}: {p}" for p in exc.problems)
            continue
        uri = cfg.server_uri
        if any(uri == p.rstrip("/") or uri.startswith(p) for p in RESERVED_PREFIXES):
            problems.append(
                f"{_relative(path, root)}: server.server_uri {uri!r} shadows a gateway route"
            )
        entries.append(
            CatalogEntry(
                id=cfg.id,
                category=cfg.category,
                host=cfg.host,
                port=cfg.port,
                server_uri=uri,
                async_enabled=cfg.async_enabled,
                request_size_limit_mb=cfg.request_size_limit,
                source=_relative(path, root),
                config_path=str(path.resolve()),
                model_type=cfg.model_type,
                job_store=cfg.job_store,
            )
        )
    return entries, problems


def apply_overrides(
    entries: list[CatalogEntry], control: ControlConfig
) -> tuple[list[CatalogEntry], list[str]]:
    """Entries with ``[servers.<id>]`` and supervisor defaults applied."""
    problems: list[str] = []
    ids = [e.id for e in entries]
    for server_id in control.servers:
        if server_id not in ids:
            problems.append(
                f"{control.source}: [servers.{server_id}]: no such catalog id"
                f"{did_you_mean(server_id, ids)}"
            )
    result: list[CatalogEntry] = []
    sup = control.supervisor
    for entry in entries:
        o = control.servers.get(entry.id)
        result.append(
            CatalogEntry(
                **{
                    **entry.__dict__,
                    "enabled": o.enabled if o else True,
                    "autostart": (
                        o.autostart if o and o.autostart is not None else sup.autostart_default
                    ),
                    "restart_policy": (
                        o.restart_policy
                        if o and o.restart_policy is not None
                        else sup.restart_policy
                    ),
                    "port": o.port if o and o.port is not None else entry.port,
                    "replicas": (
                        o.autoscale.max_replicas
                        if o and o.autoscale is not None
                        else o.replicas
                        if o and o.replicas is not None
                        else 1
                    ),
                    "remote_upstreams": control.upstreams.get(entry.id, ()),
                    "autoscale": o.autoscale if o else None,
                }
            )
        )
    for server_id in control.upstreams:
        if server_id not in ids:
            problems.append(
                f"{control.source}: [gateway.upstreams] {server_id}: no such catalog id"
                f"{did_you_mean(server_id, ids)}"
            )
    problems.extend(check_shared_store(result))
    return result, problems


def check_shared_store(entries: list[CatalogEntry]) -> list[str]:
    """An id served by several processes needs the shared job store (see the module)."""
    problems: list[str] = []
    for e in entries:
        processes = e.replicas + len(e.remote_upstreams)
        if e.autoscale is not None and e.job_store != "redis":
            problems.append(
                f'{e.source} ({e.id}): autoscaling (max_replicas) needs job_store = "redis" '
                "in its [server] table: replicas that start and stop must share their "
                "jobs (a stopped replica hands its claims back to the others); with the "
                "in-memory store use a fixed replicas = N"
            )
        elif processes > 1 and e.job_store != "redis":
            what = f"replicas = {e.replicas}" if e.replicas > 1 else "[gateway.upstreams]"
            problems.append(
                f'{e.source} ({e.id}): {what} needs job_store = "redis" in its [server] '
                "table: with the in-memory store every process keeps its own jobs, so a "
                "poll, wait or result answered by another replica would be a 404"
            )
    return problems


def build_catalog(control: ControlConfig) -> Catalog:
    """The effective catalog for ``control``; raises :class:`ConfigErrors` with all problems."""
    root = Path(control.root)
    entries, problems = discover(control.path(control.supervisor.catalog_dir), root)
    entries, more = apply_overrides(entries, control)
    problems.extend(more)
    problems.extend(check_unique(entries))
    if problems:
        raise ConfigErrors("catalog", problems)
    return Catalog(entries)
