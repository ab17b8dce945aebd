"""The supervisor as a real process: crash-restart of a child, no orphans even when
the supervisor itself is killed with SIGKILL, and generated tokens kept out of logs."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import free_port, stop_process

from .plane import ROOT, call, control_plane, pid_alive, wait_until

pytestmark = pytest.mark.slow


def test_crashed_model_is_restarted_then_orphans_die_with_a_killed_supervisor(
    tmp_path: Path,
) -> None:
    """A model killed behind the supervisor's back comes back (on-failure); after a
    SIGKILL of the supervisor the kernel's parent-death signal stops every child."""
    with control_plane(tmp_path, ["FAKE_SYNC"]) as plane:
        status = plane.wait_ready(["gateway", "FAKE_SYNC"])
        old = status["FAKE_SYNC"]["pid"]
        os.kill(old, signal.SIGKILL)
        wait_until(
            lambda: (s := plane.status().get("FAKE_SYNC", {})).get("ready") and s["pid"] != old,
            60,
            "FAKE_SYNC restarted",
        )
        st = plane.status()["FAKE_SYNC"]
        assert st["restart_count"] == 1 and st["last_exit"]["signal"] == 9
        children = plane.child_pids()
        assert len(children) == 2
        plane.process.kill()
        plane.process.wait(10)
        wait_until(lambda: not any(pid_alive(p) for p in children), 30, "children gone")


def _read_ready(fd: int, into: bytearray) -> bytes:
    """Append what ``fd`` holds now (non-blocking) to ``into``; return all so far."""
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side of the pty closed
            break
        if not chunk:
            break
        into.extend(chunk)
    return bytes(into)


def test_generated_tokens_reach_the_terminal_and_no_log_file(tmp_path: Path) -> None:
    """A supervisor that generates its tokens, with its log in a file and stderr on a
    terminal: the tokens and sign-in link appear on the terminal and work, and neither
    the supervisor's log file nor a child's log holds any of them."""
    api_port, gw_port = free_port(), free_port()
    log_dir, log_file = tmp_path / "logs", tmp_path / "supervisor.log"
    config = tmp_path / "mortred.toml"
    config.write_text(
        f'[supervisor]\ncatalog_dir = "{ROOT / "conf" / "server"}"\napi_port = {api_port}\n'
        f'log_dir = "{log_dir}"\nprobe_interval_ms = 100\n[gateway]\nport = {gw_port}\n'
        f'api_keys = "{tmp_path / "api_keys.toml"}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    master, slave = pty.openpty()
    cmd = [
        sys.executable, "-m", "mortred_twisted.supervisor.launch", "-n", "--pidfile=",
        f"--logfile={log_file}", "mortred-supervisor", "--config", str(config),
        "--no-autostart",
    ]  # fmt: skip
    # A new session: no controlling terminal, so the pty on stderr is the only one.
    process = subprocess.Popen(
        cmd, cwd=str(tmp_path), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=slave, start_new_session=True, text=True,
    )  # fmt: skip
    os.close(slave)
    shown = bytearray()
    try:
        text = wait_until(
            lambda: "sign-in link" in (t := _read_ready(master, shown).decode()) and t,
            60,
            "the tokens on the terminal",
        )
        tokens = dict(re.findall(r"(MORTRED_\w+_TOKEN)=(\S+)", text))
        assert set(tokens) == {"MORTRED_API_TOKEN", "MORTRED_GATEWAY_AUTH_TOKEN"}, text
        assert f"#token={tokens['MORTRED_API_TOKEN']}" in text
        wait_until(lambda: _status(api_port, tokens["MORTRED_API_TOKEN"]) == 200, 60, "the API")
        assert _status(api_port, "wrong") == 401
        wait_until(lambda: (log_dir / "gateway.log").is_file(), 30, "the gateway's log")
    finally:
        stop_process(process, 30)
        os.close(master)
    logged = log_file.read_text()
    assert "mortred control plane" in logged and f":{api_port}/" in logged
    for path in [log_file, *log_dir.glob("*.log")]:
        content = path.read_text()
        leaked = [name for name, value in tokens.items() if value in content]
        assert not leaked and "#token=" not in content, (path, leaked)


def _status(port: int, token: str) -> int | None:
    try:
        return call(port, "GET", "/api/v1/status", token=token, timeout=5)[0]
    except OSError:
        return None
