"""Server TOML loading: every shipped config loads; errors are reported all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config, find_root, load_server_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "conf" / "server").rglob("*.toml"))


def test_there_are_shipped_configs() -> None:
    """The tree ships the fake configs at least."""
    names = {p.name for p in SHIPPED}
    assert {"fake_async.toml", "fake_sync.toml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_loads(path: Path) -> None:
    """Each conf/server/**.toml validates and its model config file exists."""
    config = load_server_config(path, env={})
    assert config.host == "127.0.0.1", "model ports are loopback-only"
    if config.model_config:
        assert (ROOT / config.model_config).is_file()


def test_shipped_ids_ports_and_uris_are_unique() -> None:
    """No two shipped servers share a catalog id, a port or a server_uri."""
    configs = [load_server_config(p, env={}) for p in SHIPPED]
    for attr in ("id", "port", "server_uri"):
        values = [getattr(c, attr) for c in configs]
        dupes = {v for v in values if values.count(v) > 1}
        assert not dupes, f"duplicate {attr}: {dupes}"


def test_root_is_the_parent_of_conf() -> None:
    """Paths in configs are relative to the folder holding conf/."""
    assert find_root(ROOT / "conf" / "server" / "fake" / "fake_async.toml") == ROOT


def test_all_problems_are_reported_at_once_with_did_you_mean() -> None:
    """Several mistakes give one ConfigErrors listing each, with near-miss hints."""
    doc = {
        "server": {"id": "X", "prot": 1, "worker_nums": 0, "async_enabled": "yes"},
        "model": {},
        "modle": {},
    }
    with pytest.raises(ConfigErrors) as info:
        build_server_config(doc, env={})
    problems = "\n".join(info.value.problems)
    assert "server.prot: unknown key (did you mean 'port'?)" in problems
    assert "server.worker_nums: must be >= 1" in problems
    assert "server.async_enabled: expected bool" in problems
    assert "unknown table [modle] (did you mean 'model'?)" in problems
    assert "model.type: required" in problems
    assert len(info.value.problems) == 5


def test_environment_overrides_win() -> None:
    """MORTRED_LISTEN_PORT/HOST/AUTH_TOKEN and MORTRED_<KEY> override the file."""
    doc = {"server": {"id": "X", "port": 1000}, "model": {"type": "fake"}}
    env = {
        "MORTRED_LISTEN_PORT": "2000",
        "MORTRED_AUTH_TOKEN": "t",
        "MORTRED_ASYNC_MAX_QUEUE": "3",
        "MORTRED_ASYNC_ENABLED": "true",
    }
    config = build_server_config(doc, env=env)
    assert (config.port, config.auth_token, config.async_max_queue) == (2000, "t", 3)
    assert config.async_enabled is True
    with pytest.raises(ConfigErrors, match="MORTRED_ASYNC_MAX_QUEUE"):
        build_server_config(doc, env={"MORTRED_ASYNC_MAX_QUEUE": "many"})


def test_model_overrides_merge_over_the_model_file(tmp_path: Path) -> None:
    """Keys in [model] override the model config file."""
    (tmp_path / "m.toml").write_text("a = 1\nb = 2\n")
    doc = {"server": {"id": "X"}, "model": {"type": "fake", "config": "m.toml", "b": 3}}
    config = build_server_config(doc, root=tmp_path, env={})
    assert dict(config.model_options) == {"a": 1, "b": 3}
    bad = {"server": {"id": "X"}, "model": {"type": "fake", "config": "missing.toml"}}
    with pytest.raises(ConfigErrors, match="file not found"):
        build_server_config(bad, root=tmp_path, env={})


def test_server_uri_may_not_shadow_jobs() -> None:
    """server_uri must start with / and must not be /jobs."""
    doc = {"server": {"id": "X", "server_uri": "/jobs"}, "model": {"type": "fake"}}
    with pytest.raises(ConfigErrors, match="shadow"):
        build_server_config(doc, env={})


def test_http_server_twisted_is_refused_with_a_clear_word() -> None:
    """twisted.web is no longer offered: ``http_server = "twisted"`` (file or env) is a
    config error saying so; "llhttp" (the one server) is accepted and ignored."""
    doc = {"server": {"id": "X", "http_server": "llhttp"}, "model": {"type": "fake"}}
    build_server_config(doc, env={})
    env = {"MORTRED_HTTP_SERVER": "twisted"}
    with pytest.raises(ConfigErrors, match="no longer offered"):
        build_server_config({"server": {"id": "X"}, "model": {"type": "fake"}}, env=env)
