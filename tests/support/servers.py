"""Start real model-server processes (``twistd -n mortred-model``) for end-to-end tests.

Usage::

    from tests.support.servers import model_server

    env = {"MORTRED_ASYNC_MAX_QUEUE": "2"}
    with model_server("conf/server/fake/fake_async.toml", env=env) as srv:
        status, headers, body = srv.request("GET", "/ready")

The server listens on a free loopback port (``MORTRED_LISTEN_PORT``), runs the source
tree of this checkout (``PYTHONPATH``), and finds the twistd plugin from a temporary
``twisted/plugins`` folder, so no install is needed. Readiness is awaited by
watching the process log for the runtime's "ready"/"NOT READY" line (an event, not
a sleep). The context manager stops the process with SIGTERM (then SIGKILL).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LISTENING_MARKER = "listening on http://"
READY_MARKERS = (" worker(s)", "NOT READY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plugin_path() -> str:
    """A temporary sys.path entry holding ``twisted/plugins/mortred_plugins.py``."""
    base = Path(tempfile.mkdtemp(prefix="mortred-plugins-"))
    target = base / "twisted" / "plugins"
    target.mkdir(parents=True)
    shutil.copy(ROOT / "twisted_plugins" / "mortred_plugins.py", target)
    return str(base)


class RunningServer:
    """A model server child process and a tiny blocking HTTP client for it."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log: list[str] = []
        self.ready_line: str | None = None
        self._listening = False
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)
            self._listening = self._listening or LISTENING_MARKER in line
            if self.ready_line is None and any(m in line for m in READY_MARKERS):
                self.ready_line = line
            if self._listening and self.ready_line is not None:
                self._ready.set()
        self._ready.set()  # process ended: stop waiting

    def wait_ready(self, timeout: float = 60.0) -> str:
        if not self._ready.wait(timeout) or self.ready_line is None or not self._listening:
            raise RuntimeError("model server did not start:\n" + "".join(self.log[-40:]))
        return self.ready_line

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection: ``(status, headers, body)``."""
        hdrs = dict(headers or {})
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json; charset=utf-8")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, _headers, data = self.request(method, path, body, **kw)
        return status, json.loads(data) if data else None

    def stop(self, timeout: float = 30.0) -> int:
        code = stop_process(self.process, timeout)
        self._reader.join(5)
        return code


def stop_process(process: subprocess.Popen[str], timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


@contextmanager
def model_server(
    config: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
    wait_ready: bool = True,
    launcher: tuple[str, ...] = (),
) -> Iterator[RunningServer]:
    """Run ``twistd -n mortred-model --config <config>`` on a free port.

    ``env`` adds environment variables (``MORTRED_*`` overrides); ``launcher`` is a
    command prefix such as ``("taskset", "-c", "0")``.
    """
    port = free_port()
    plugins = plugin_path()
    child_env = {
        **os.environ,
        "MORTRED_LISTEN_HOST": "127.0.0.1",
        "MORTRED_LISTEN_PORT": str(port),
        "PYTHONPATH": os.pathsep.join([str(ROOT), plugins]),
        "PYTHONUNBUFFERED": "1",
    }
    child_env.pop("MORTRED_AUTH_TOKEN", None)
    child_env.update(env or {})
    config_path = Path(config)
    if not config_path.is_absolute():
        config_path = ROOT / config_path
    cmd = [
        *launcher,  # e.g. ("taskset", "-c", "0") to pin the server for benchmarks
        sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
        "-n", "--pidfile=", "--logfile=-",
        "mortred-model", "--config", str(config_path), *args,
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd,
        cwd=str(ROOT),
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = RunningServer(process, port)
    try:
        if wait_ready:
            server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil.rmtree(plugins, ignore_errors=True)
