"""The catalog of conf/server/**: shipped files load; clashes name both files."""

from __future__ import annotations

from pathlib import Path

import pytest

from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import ControlConfig, build_control_config, load_control_config
from mortred_twisted.config.errors import ConfigErrors

ROOT = Path(__file__).resolve().parents[2]

SERVER = """[server]
id = "{id}"
port = {port}
server_uri = "{uri}"
async_enabled = {async_}
[model]
type = "fake"
"""


def tree(tmp_path: Path, *servers: tuple[str, str, int, str]) -> ControlConfig:
    for name, sid, port, uri in servers:
        f = tmp_path / "conf" / "server" / f"{name}.toml"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(SERVER.format(id=sid, port=port, uri=uri, async_="true"))
    return build_control_config({}, root=tmp_path)


def test_shipped_catalog_loads() -> None:
    """conf/mortred.toml and every shipped server TOML form a valid catalog."""
    catalog = build_catalog(load_control_config(ROOT / "conf" / "mortred.toml"))
    assert "FAKE_ASYNC" in catalog and catalog["FAKE_ASYNC"].async_enabled
    assert not catalog["FAKE_SYNC"].async_enabled


def test_duplicates_name_both_files(tmp_path: Path) -> None:
    """Duplicate id, port and server_uri are each reported with both files."""
    config = tree(
        tmp_path,
        ("a", "X", 18001, "/a"),
        ("b", "X", 18001, "/a"),
    )
    with pytest.raises(ConfigErrors) as e:
        build_catalog(config)
    text = str(e.value)
    for what in ("duplicate id 'X'", "duplicate port 127.0.0.1:18001", "duplicate server_uri"):
        assert what in text
    assert "conf/server/a.toml" in text and "conf/server/b.toml" in text


def test_overrides_apply_and_unknown_ids_are_errors(tmp_path: Path) -> None:
    """[servers.<id>] changes port/autostart/policy; an unknown id suggests the near one."""
    tree(tmp_path, ("a", "DDPM", 18001, "/a"))
    config = build_control_config(
        {"servers": {"DDPM": {"port": 19000, "autostart": False, "restart_policy": "always"}}},
        root=tmp_path,
    )
    entry = build_catalog(config)["DDPM"]
    assert (entry.port, entry.autostart, entry.restart_policy) == (19000, False, "always")
    bad = build_control_config({"servers": {"DDMP": {}}}, root=tmp_path)
    with pytest.raises(ConfigErrors, match="did you mean 'DDPM'"):
        build_catalog(bad)


def test_reserved_uri(tmp_path: Path) -> None:
    """A server_uri under /v1/ would shadow the gateway's routes: refused."""
    with pytest.raises(ConfigErrors, match="shadows a gateway route"):
        build_catalog(tree(tmp_path, ("a", "A", 18001, "/v1/models/x")))


def test_control_config_reports_everything() -> None:
    """Unknown tables/keys, wrong types and bad policies are all reported at once."""
    with pytest.raises(ConfigErrors) as e:
        build_control_config(
            {
                "supervisr": {},
                "supervisor": {"api_prot": 1, "start_concurrency": "2"},
                "gateway": {"upstream_recv_timeout_ms": 0},
                "servers": {"X": {"restart_policy": "sometimes"}},
            }
        )
    text = str(e.value)
    for needle in (
        "did you mean 'supervisor'",
        "did you mean 'api_port'",
        "start_concurrency: expected int",
        "upstream_recv_timeout_ms: must be >= 1",
        "restart_policy: must be one of",
    ):
        assert needle in text
