"""The supervisor's twistd entry: options, tokens, autostart selection, child specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python import usage

from mortred_twisted.tap.supervisor import Options, build_service

SERVER = '[server]\nid = "{id}"\nport = {port}\nserver_uri = "/{id}"\n[model]\ntype = "fake"\n'


def conf(tmp_path: Path, extra: str = "") -> Path:
    d = tmp_path / "conf" / "server"
    d.mkdir(parents=True)
    (d / "a.toml").write_text(SERVER.format(id="A", port=18001))
    (d / "b.toml").write_text(SERVER.format(id="B", port=18002))
    path = tmp_path / "conf" / "mortred.toml"
    path.write_text(f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n{extra}')
    return path


def options(*argv: str) -> Options:
    o = Options()
    o.parseOptions(list(argv))
    return o


def test_generated_tokens_are_printed_once_and_passed_to_children(tmp_path: Path) -> None:
    """Unset tokens are generated and shown in the banner; children get only theirs."""
    svc = build_service(options("--config", str(conf(tmp_path))), MemoryReactorClock(), {})
    assert "MORTRED_API_TOKEN=" in svc.banner and "MORTRED_GATEWAY_AUTH_TOKEN=" in svc.banner
    gw = svc.supervisor.gateway
    assert gw is not None
    model = svc.supervisor.models["A"]
    internal = gw.spec.env["MORTRED_INTERNAL_TOKEN"]
    assert model.spec.env["MORTRED_AUTH_TOKEN"] == internal
    assert model.spec.env["MORTRED_LISTEN_PORT"] == "18001"
    assert "MORTRED_API_TOKEN" not in model.spec.env and "MORTRED_API_TOKEN" not in gw.spec.env
    assert "mortred-model" in model.spec.argv and "mortred-gateway" in gw.spec.argv


def test_tokens_from_environment_are_not_printed(tmp_path: Path) -> None:
    """Tokens set in the environment are used and never echoed."""
    env = {"MORTRED_API_TOKEN": "api-secret", "MORTRED_GATEWAY_AUTH_TOKEN": "gw-secret"}
    svc = build_service(options("--config", str(conf(tmp_path))), MemoryReactorClock(), env)
    assert "api-secret" not in svc.banner and "gw-secret" not in svc.banner
    assert svc.supervisor.gateway.spec.env["MORTRED_GATEWAY_AUTH_TOKEN"] == "gw-secret"  # type: ignore[union-attr]


def test_autostart_selection(tmp_path: Path) -> None:
    """Config autostart, --autostart and --no-autostart pick the boot set."""
    path = conf(tmp_path, "[servers.B]\nautostart = false\n")
    r = MemoryReactorClock()
    assert build_service(options("--config", str(path)), r, {}).autostart == ["A"]
    assert build_service(options("--config", str(path), "--autostart", "B"), r, {}).autostart == [
        "B"
    ]
    assert build_service(options("--config", str(path), "--no-autostart"), r, {}).autostart == []
    with pytest.raises(usage.UsageError, match="unknown id"):
        build_service(options("--config", str(path), "--autostart", "C"), r, {})


def test_catalog_errors_stop_startup(tmp_path: Path) -> None:
    """A duplicate port in the catalog is a usage error naming both files."""
    path = conf(tmp_path)
    (tmp_path / "conf" / "server" / "c.toml").write_text(SERVER.format(id="C", port=18001))
    with pytest.raises(usage.UsageError) as e:
        build_service(options("--config", str(path)), MemoryReactorClock(), {})
    assert "a.toml" in str(e.value) and "c.toml" in str(e.value)


def test_no_gateway(tmp_path: Path) -> None:
    """--no-gateway runs the models only."""
    svc = build_service(
        options("--config", str(conf(tmp_path)), "--no-gateway"), MemoryReactorClock(), {}
    )
    assert svc.supervisor.gateway is None
