"""Room for a new model in a catalog: an id, a port and a ``server_uri`` that no
server file of the catalog uses (``mortredctl model new``).

Two server files with one port or one ``server_uri`` stop the supervisor
(``duplicate port``, ``duplicate server_uri``: :func:`~mortred_twisted.config.
catalog.check_unique`), so a scaffold that always wrote the same ones collided with
the second model. Which catalog a new folder joins:

* ``--catalog mortred.toml``: that control config's ``catalog_dir`` (every ``*.toml``
  below it, as the supervisor reads it), with its ``[servers.<id>]`` ports and
  replica counts (an id on ``port`` uses ``port … port+replicas-1``, autoscaled: up
  to ``max_replicas``) and its own ``api_port`` and gateway ``port``;
* ``--catalog DIR``: every ``*.toml`` below ``DIR``;
* neither: the folder above the new one, its ``*.toml`` and ``*/*.toml`` (the
  server files of sibling model folders; not a deep walk of, say, a home folder).

Files that are not server files (no ``[server]`` table, not TOML) take no room. A
port is free when no server file of the catalog names it and nothing listens on it
here now (:func:`is_listening`); ids and URIs get a ``_2``, ``_3``… suffix when taken.
Reads files; no reactor, no network beyond a local bind probe.
"""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.config.catalog import RESERVED_PREFIXES
from mortred_twisted.config.control import ControlConfig, load_control_config

#: Where scaffolded ports start (the shipped catalog uses 18100–18199).
FIRST_PORT = 18300
LAST_PORT = 18999


class NoRoom(Exception):
    """No free port in the scaffold's range."""


@dataclass(frozen=True)
class Taken:
    """What a catalog's server files (and control config) already use."""

    ids: frozenset[str]
    ports: frozenset[int]
    uris: frozenset[str]
    #: a few words on where these came from, for the command's output
    where: str


def _server_table(path: Path) -> dict[str, Any] | None:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    table = doc.get("server")
    return table if isinstance(table, dict) else None


def _files(folder: Path, deep: bool) -> Iterator[Path]:
    if not folder.is_dir():
        return iter(())
    if deep:
        return iter(sorted(folder.rglob("*.toml")))
    return iter(sorted([*folder.glob("*.toml"), *folder.glob("*/*.toml")]))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_taken(files: Iterable[Path], where: str, control: ControlConfig | None = None) -> Taken:
    """The ids, ports and URIs of ``files`` (server TOMLs), with ``control``'s
    ``[servers.<id>]`` ports and replica counts and its own two ports."""
    ids: set[str] = set()
    ports: set[int] = set()
    uris: set[str] = set()
    for path in files:
        table = _server_table(path)
        if table is None:
            continue
        sid = table.get("id")
        override = control.servers.get(sid) if control and isinstance(sid, str) else None
        if isinstance(sid, str):
            ids.add(sid)
        uri = table.get("server_uri", "/infer")  # ServerConfig's default
        if isinstance(uri, str):
            uris.add(uri)
        port = _int(table.get("port", 18100))  # ServerConfig's default
        count = 1
        if override is not None:
            if override.port is not None:
                port = override.port
            if override.autoscale is not None:
                count = override.autoscale.max_replicas
            elif override.replicas is not None:
                count = override.replicas
        if port:
            ports.update(range(port, port + max(1, count)))
    if control is not None:
        ports.update((control.supervisor.api_port, control.gateway.port))
    return Taken(frozenset(ids), frozenset(ports), frozenset(uris), where)


def taken_by(catalog: Path | None, new_folder: Path) -> Taken:
    """What the catalog ``new_folder`` joins already uses (see the module docstring);
    raises :class:`~mortred_twisted.config.errors.ConfigErrors` for a control config
    that does not load."""
    if catalog is None:
        parent = new_folder.resolve().parent
        return read_taken(_files(parent, deep=False), f"the server files beside it ({parent})")
    if catalog.is_dir():
        return read_taken(_files(catalog, deep=True), f"the catalog {catalog}")
    control = load_control_config(catalog)
    folder = control.path(control.supervisor.catalog_dir)
    return read_taken(_files(folder, deep=True), f"the catalog of {catalog} ({folder})", control)


def is_listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` cannot be bound now (something listens on it, or on
    every address); a probe only: the socket is closed at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:  # in use (or not ours to bind): not a port to hand out
            return True
    return False


def pick_port(taken: Taken, listening: Callable[[int], bool] = is_listening) -> int:
    """The first port from :data:`FIRST_PORT` that the catalog does not use and
    nothing listens on."""
    for port in range(FIRST_PORT, LAST_PORT + 1):
        if port not in taken.ports and not listening(port):
            return port
    raise NoRoom(f"no free port in {FIRST_PORT}-{LAST_PORT}: set [server] port yourself")


def _first_free(candidates: Iterator[str], used: frozenset[str]) -> str:
    for candidate in candidates:
        if candidate not in used:
            return candidate
    raise AssertionError("unreachable: the candidates never end")  # pragma: no cover


def _numbered(base: str, fmt: str) -> Iterator[str]:
    yield fmt.format(base)
    n = 2
    while True:
        yield fmt.format(f"{base}_{n}")
        n += 1


def pick_id(module: str, taken: Taken) -> str:
    """``SHARPEN`` (or ``SHARPEN_2``, … when taken)."""
    return _first_free(_numbered(module.upper(), "{}"), taken.ids)


def pick_uri(module: str, taken: Taken) -> str:
    """``/mortred/<module>/infer`` (or ``…/<module>_2/…`` when taken); never under a
    gateway route (``RESERVED_PREFIXES``: the ``/mortred/`` prefix keeps it clear)."""
    uri = _first_free(_numbered(module, "/mortred/{}/infer"), taken.uris)
    assert not any(uri.startswith(p) for p in RESERVED_PREFIXES)
    return uri
