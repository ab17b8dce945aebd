"""A real ``redis-server`` (Debian's, from ``$PATH``) for tests, on a free loopback port.

Usage::

    from tests.support.redis_server import redis_server

    with redis_server() as redis:
        env = {"MORTRED_JOB_STORE": "redis", "MORTRED_REDIS_URL": redis.url}

Each server gets its own temporary data directory with the append-only file on
(``--appendonly yes``, no RDB snapshots), so :meth:`RedisServer.restart` brings the
same data back. Readiness is awaited by reading the server's log for "Ready to
accept connections" (an event, not a sleep).

Options: ``password`` (``--requirepass``), ``tls`` (a :class:`~tests.support.tls.TlsFiles`
PKI: TLS only, ``rediss://127.0.0.1:<port>/0``; ``client_certs`` makes Redis require
a client certificate), ``cluster`` (cluster mode, one node owning every slot: a
script touching a key outside its declared keys' slot is refused), ``args`` (more
``redis-server`` arguments, e.g. an ACL user).

No ``redis-server`` installed: ``pytest.skip`` locally, but a **failure under
``CI=true``** (a CI run must not pass with the whole Redis path untested; ``.ci/run``
installs it), as the browser test does for chromium.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.servers import free_port, stop_process
from tests.support.tls import TlsFiles
from tests.support.waiting import wait_until

IN_CI = os.environ.get("CI", "").lower() == "true"

READY_MARKER = "Ready to accept connections"


class RedisServer:
    """One redis-server child process; restartable on the same port and data."""

    def __init__(
        self,
        binary: str,
        port: int,
        data_dir: Path,
        password: str | None = None,
        *,
        tls: TlsFiles | None = None,
        client_certs: bool = False,
        cluster: bool = False,
        args: Sequence[str] = (),
        bind: str = "127.0.0.1",
    ) -> None:
        self.binary = binary
        self.port = port
        self.data_dir = data_dir
        self.password = password  # --requirepass (the "default" user's password)
        self.tls = tls
        self.client_certs = client_certs
        self.cluster = cluster
        self.args = list(args)
        self.bind = bind
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    def start(self, timeout: float = 30.0) -> None:
        port = ["--port", str(self.port)]
        if self.tls is not None:
            port = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.server_cert),
                "--tls-key-file", str(self.tls.server_key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "yes" if self.client_certs else "no",
            ]  # fmt: skip
        cluster = []
        if self.cluster:
            nodes = self.data_dir / "nodes.conf"
            cluster = [
                "--cluster-enabled", "yes", "--cluster-config-file", str(nodes),
                "--cluster-port", str(free_port()),  # not port + 10000 (may be > 65535)
            ]  # fmt: skip
        cmd = [
            self.binary, *port, "--bind", *self.bind.split(),
            "--dir", str(self.data_dir), "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--protected-mode", "yes", "--daemonize", "no",
            *(["--requirepass", self.password] if self.password else []),
            *cluster, *self.args,
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
        if self.cluster and "cluster_state:ok" not in self.command("CLUSTER", "INFO"):
            self.command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            # the node takes its slots within a few cron ticks (a child process: poll)
            wait_until(lambda: "cluster_state:ok" in self.command("CLUSTER", "INFO"),
                       10, "the cluster-mode redis-server to own every slot")  # fmt: skip

    def stop(self) -> None:
        """SIGTERM (redis-server flushes its append-only file on the way out)."""
        if self.process is not None:
            stop_process(self.process, 30)
            self.process = None

    def kill(self) -> None:
        """SIGKILL: no flush of the append-only file beyond what ``everysec`` wrote."""
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
        tls: list[str] = []
        if self.tls is not None:
            tls = ["--tls", "--cacert", str(self.tls.ca)]
            if self.client_certs:
                tls += ["--cert", str(self.tls.client_cert), "--key", str(self.tls.client_key)]
        out = subprocess.run(
            [cli, "-h", self.bind.split()[0], "-p", str(self.port), *auth, *tls, *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.strip()


def redis_binary() -> str:
    """The ``redis-server`` to run; skip without one, but fail under ``CI=true``."""
    binary = shutil.which("redis-server")
    if binary is None:
        if IN_CI:
            pytest.fail(
                "CI=true but redis-server is not installed: the Redis job store cannot be "
                "tested (apt-get install -y redis-server; .ci/run tries it)",
                pytrace=False,
            )
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return binary


@contextmanager
def redis_server(
    password: str | None = None,
    *,
    tls: TlsFiles | None = None,
    client_certs: bool = False,
    cluster: bool = False,
    args: Sequence[str] = (),
    bind: str = "127.0.0.1",
) -> Iterator[RedisServer]:
    """A started redis-server on a free port with a temporary data dir (removed after);
    see the module docstring for the options."""
    binary = redis_binary()
    data_dir = Path(tempfile.mkdtemp(prefix="mortred-redis-"))
    server = RedisServer(
        binary, free_port(), data_dir, password, tls=tls, client_certs=client_certs,
        cluster=cluster, args=args, bind=bind,
    )  # fmt: skip
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
