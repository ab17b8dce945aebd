"""A real ``redis-server`` (Debian's, from ``$PATH``) for tests, on a free loopback port.

Usage::

    from tests.support.redis_server import redis_server

    with redis_server() as redis:
        env = {"MORTRED_JOB_STORE": "redis", "MORTRED_REDIS_URL": redis.url}

Each server gets its own temporary data directory with the append-only file on
(``--appendonly yes``, no RDB snapshots), so :meth:`RedisServer.restart` brings the
same data back. Readiness is awaited by reading the server's log for "Ready to
accept connections" (an event, not a sleep). ``pytest.skip`` when no
``redis-server`` is installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.servers import free_port, stop_process

READY_MARKER = "Ready to accept connections"


class RedisServer:
    """One redis-server child process; restartable on the same port and data."""

    def __init__(self, binary: str, port: int, data_dir: Path, password: str | None = None) -> None:
        self.binary = binary
        self.port = port
        self.data_dir = data_dir
        self.password = password  # --requirepass (the "default" user's password)
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir), "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--protected-mode", "yes", "--daemonize", "no",
            *(["--requirepass", self.password] if self.password else []),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.log.append(line)
                if READY_MARKER in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.process.poll() is not None:
            raise RuntimeError("redis-server did not start:\n" + "".join(self.log[-20:]))

    def stop(self) -> None:
        """SIGTERM (redis-server flushes its append-only file on the way out)."""
        if self.process is not None:
            stop_process(self.process, 30)
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def command(self, *args: str) -> str:
        """One command through ``redis-cli`` (for assertions and setup)."""
        cli = shutil.which("redis-cli") or "redis-cli"
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        out = subprocess.run(
            [cli, "-p", str(self.port), *auth, *args], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()


@contextmanager
def redis_server(password: str | None = None) -> Iterator[RedisServer]:
    """A started redis-server on a free port with a temporary data dir (removed after);
    ``password`` turns on ``--requirepass``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    data_dir = Path(tempfile.mkdtemp(prefix="mortred-redis-"))
    server = RedisServer(binary, free_port(), data_dir, password)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
