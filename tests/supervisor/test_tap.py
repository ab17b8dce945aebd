"""The supervisor's twistd entry: options, tokens, autostart selection, child specs."""

from __future__ import annotations

import errno
import io
from pathlib import Path
from typing import IO, Any

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python import usage

from mortred_twisted.tap.supervisor import Options, build_service, show_on_terminal

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


def test_generated_tokens_are_shown_apart_from_the_banner_and_passed_to_children(
    tmp_path: Path,
) -> None:
    """Unset tokens are generated and kept for the terminal (with the sign-in link),
    never in the logged banner; children get only theirs."""
    svc = build_service(options("--config", str(conf(tmp_path))), MemoryReactorClock(), {})
    assert "MORTRED_API_TOKEN=" in svc.secrets and "MORTRED_GATEWAY_AUTH_TOKEN=" in svc.secrets
    assert "/#token=" in svc.secrets
    assert "TOKEN=" not in svc.banner and "#token=" not in svc.banner
    assert "http://127.0.0.1:8787/" in svc.banner
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
    assert svc.secrets == ""
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


class Recorder:
    """A terminal stand-in: records what it is shown, answers ``shown``."""

    def __init__(self, shown: bool = True) -> None:
        self.texts: list[str] = []
        self.shown = shown

    def __call__(self, text: str) -> bool:
        self.texts.append(text)
        return self.shown


def _started_log(svc: Any) -> str:
    """Start ``svc`` and return every log event's text it emitted while starting."""
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        svc.startService()
    finally:
        globalLogPublisher.removeObserver(events.append)
    return "\n".join(str(formatEvent(e)) for e in events)


def test_tokens_go_to_the_terminal_and_never_to_the_log(tmp_path: Path) -> None:
    """At start the banner is logged and the generated tokens and sign-in link are
    shown on the terminal only: no log event carries a token."""
    path = conf(tmp_path)
    svc = build_service(options("--config", str(path), "--no-autostart",
                                "--no-gateway"), MemoryReactorClock(), {})  # fmt: skip
    terminal = Recorder()
    svc.show = terminal
    text = _started_log(svc)
    tokens = [line.split("=", 1)[1] for line in svc.secrets.splitlines() if "TOKEN=" in line]
    assert terminal.texts == [svc.secrets] and len(tokens) == 2
    assert "mortred control plane" in text
    assert "#token=" not in text and "TOKEN=" not in text
    assert not [t for t in tokens if t in text]


def test_without_a_terminal_the_tokens_are_not_shown_and_the_log_says_what_to_set(
    tmp_path: Path,
) -> None:
    """A supervisor with no terminal (a daemon, output to files) shows no token
    anywhere and logs which variables to set instead."""
    svc = build_service(options("--config", str(conf(tmp_path)), "--no-autostart",
                                "--no-gateway"), MemoryReactorClock(), {})  # fmt: skip
    svc.show = Recorder(shown=False)
    text = _started_log(svc)
    assert "were not shown" in text and "MORTRED_API_TOKEN" in text
    tokens = [line.split("=", 1)[1] for line in svc.secrets.splitlines() if "TOKEN=" in line]
    assert len(tokens) == 2 and not [t for t in tokens if t in text]


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_show_on_terminal_prefers_a_terminal_stderr_then_the_controlling_tty() -> None:
    """stderr when it is a terminal; else /dev/tty; else nothing is written (False)."""
    err = FakeStream(tty=True)
    assert show_on_terminal("secret", stderr=err) and err.getvalue() == "secret\n"

    tty = FakeStream(tty=True)
    tty.close = lambda: None  # type: ignore[method-assign]
    piped = FakeStream(tty=False)
    assert show_on_terminal("secret", stderr=piped, open_tty=lambda: tty)
    assert piped.getvalue() == "" and tty.getvalue() == "secret\n"

    def no_tty() -> IO[str]:
        raise OSError(errno.ENXIO, "No such device or address")

    assert not show_on_terminal("secret", stderr=piped, open_tty=no_tty)
    assert piped.getvalue() == ""
