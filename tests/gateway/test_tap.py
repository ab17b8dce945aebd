"""The gateway's twistd entry: options, config errors, fail-closed start, key reload."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mortred_twisted.gateway.access import InsecureStartup
from mortred_twisted.gateway.apikeys import hash_key
from mortred_twisted.tap.gateway import Options, build_service

SERVER = '[server]\nid = "A"\nport = 18001\nserver_uri = "/a"\n[model]\ntype = "fake"\n'


def conf(tmp_path: Path, gateway: str = "") -> Path:
    (tmp_path / "conf" / "server").mkdir(parents=True)
    (tmp_path / "conf" / "server" / "a.toml").write_text(SERVER)
    path = tmp_path / "conf" / "mortred.toml"
    path.write_text(f"[gateway]\nport = 0\n{gateway}")
    return path


def options(*argv: str) -> Options:
    o = Options()
    o.parseOptions(list(argv))
    return o


def test_builds_on_loopback_without_credentials(tmp_path: Path) -> None:
    """On loopback with nothing configured the gateway starts (open, with a warning)."""
    svc = build_service(options("--config", str(conf(tmp_path))), MemoryReactorClock(), {})
    assert svc.app.policy.open and list(svc.app.catalog) == ["A"]


def test_refuses_open_gateway_off_loopback(tmp_path: Path) -> None:
    """No token and no keys on 0.0.0.0 is refused (fail-closed)."""
    path = conf(tmp_path)
    with pytest.raises(InsecureStartup):
        build_service(options("--config", str(path), "--host", "0.0.0.0"), MemoryReactorClock(), {})
    env = {"MORTRED_GATEWAY_AUTH_TOKEN": "t"}
    svc = build_service(
        options("--config", str(path), "--host", "0.0.0.0"), MemoryReactorClock(), env
    )
    assert not svc.app.policy.open


def test_config_errors_are_usage_errors(tmp_path: Path) -> None:
    """A bad mortred.toml stops start-up with every problem listed."""
    path = conf(tmp_path, "upstream_recv_timeout_ms = -1\nbogus = 1\n")
    with pytest.raises(usage.UsageError) as e:
        build_service(options("--config", str(path)), MemoryReactorClock(), {})
    assert "upstream_recv_timeout_ms" in str(e.value) and "bogus" in str(e.value)


def test_reload_keys_keeps_old_ring_on_error(tmp_path: Path) -> None:
    """SIGHUP reload: a valid file replaces the keys; a broken one is rejected, old keys stay."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "a"\nsha256 = "{hash_key("k1")}"\n')
    path = conf(tmp_path, f'api_keys = "{keys}"\n')
    env = {"MORTRED_INTERNAL_TOKEN": "i"}
    svc = build_service(options("--config", str(path)), MemoryReactorClock(), env)
    assert svc.app.policy.keys.lookup("k1") is not None
    keys.write_text(f'[[keys]]\nname = "b"\nsha256 = "{hash_key("k2")}"\n')
    assert svc.reload_keys() and svc.app.policy.keys.lookup("k2") is not None
    keys.write_text("[[keys]]\nname = 3\n")
    assert not svc.reload_keys() and svc.app.policy.keys.lookup("k2") is not None


def test_keys_without_an_internal_token_are_refused_at_start_and_on_reload(
    tmp_path: Path,
) -> None:
    """A gateway with API keys and no MORTRED_INTERNAL_TOKEN does not start; one
    started without keys keeps none when a reload would bring some."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "a"\nsha256 = "{hash_key("k1")}"\n')
    path = conf(tmp_path, f'api_keys = "{keys}"\n')
    with pytest.raises(InsecureStartup, match="MORTRED_INTERNAL_TOKEN"):
        build_service(options("--config", str(path)), MemoryReactorClock(), {})
    keys.write_text("")
    svc = build_service(options("--config", str(path)), MemoryReactorClock(), {})
    keys.write_text(f'[[keys]]\nname = "a"\nsha256 = "{hash_key("k1")}"\n')
    assert not svc.reload_keys() and svc.app.policy.keys.lookup("k1") is None


def test_port_must_be_integer() -> None:
    """--port must be a number."""
    with pytest.raises(usage.UsageError):
        options("--port", "eighty")
