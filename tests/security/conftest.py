"""Real processes for the framing and abuse suites: a model server (the fake async
model, behind an internal token) and a gateway in front of it, each on a free
loopback port, both served by the project's one HTTP server.

The model is started with :func:`tests.support.servers.model_server`; the gateway with
``twistd -n mortred-gateway`` on a temporary ``conf/mortred.toml`` whose catalog is the
repository's with only ``FAKE_ASYNC`` enabled (the shape of
:func:`tests.control.plane.control_plane`, without the supervisor, so the gateway's
``--read-timeout`` can be short). Both deadlines are short so the 408 row is quick.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mortred_twisted.config.catalog import discover
from tests.support.servers import ROOT, free_port, model_server, plugin_path, stop_process

MODEL = "FAKE_ASYNC"
INTERNAL_TOKEN = "security-internal-token"
GATEWAY_TOKEN = "security-gateway-token"
#: The model port's request_read_timeout and the gateway's --read-timeout (seconds).
READ_DEADLINE_S = 1.5
#: The rate_limit_qps (per client) of the rate-limited model of
#: tests/security/test_client_address.py (the model here has none: its rate limit is
#: taken from the head, so the framing rows would be 429s).
MODEL_QPS = 0.2


@dataclass(frozen=True)
class Target:
    """A process under test: where to send, the POST route, and its credentials."""

    name: str
    port: int
    post_path: bytes
    auth: bytes
    process: subprocess.Popen[str]
    #: the answer to a framed POST of ``{}`` (the model and gateway: 422 invalid
    #: envelope; the supervisor's proxy: 404, no such server)
    empty_post_status: int = 422

    def alive(self) -> bool:
        return self.process.poll() is None


class GatewayProcess:
    """``twistd -n mortred-gateway`` as a child; ready once its port is listening."""

    def __init__(self, tmp: Path, model_port: int) -> None:
        self.port = free_port()
        entries, problems = discover(ROOT / "conf" / "server", ROOT)
        assert not problems, problems
        lines = [
            "[supervisor]",
            f'catalog_dir = "{ROOT / "conf" / "server"}"',
            "[gateway]",
            f"port = {self.port}",
            f'api_keys = "{tmp / "api_keys.toml"}"',
            "upstream_recv_timeout_ms = 10000",
        ]
        for e in entries:
            lines.append(f"[servers.{e.id}]")
            lines.append(f"port = {model_port}" if e.id == MODEL else "enabled = false")
        conf = tmp / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "mortred.toml").write_text("\n".join(lines) + "\n")
        self.plugins = plugin_path()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
        env.update(
            {
                "PYTHONPATH": os.pathsep.join([str(ROOT), self.plugins]),
                "PYTHONUNBUFFERED": "1",
                "MORTRED_GATEWAY_AUTH_TOKEN": GATEWAY_TOKEN,
                "MORTRED_INTERNAL_TOKEN": INTERNAL_TOKEN,
            }
        )
        cmd = [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "--logfile=-", "mortred-gateway",
            "--config", str(conf / "mortred.toml"), "--port", str(self.port),
            "--read-timeout", str(READ_DEADLINE_S),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd, cwd=str(tmp), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.log: list[str] = []
        self.listening = False
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)
            if f"starting on {self.port}" in line:
                self.listening = True
                self._listening.set()
        self._listening.set()  # exited: stop waiting

    def wait_listening(self, timeout: float = 60.0) -> None:
        if not self._listening.wait(timeout) or not self.listening:
            raise RuntimeError("gateway did not start:\n" + "".join(self.log[-40:]))

    def stop(self) -> None:
        stop_process(self.process, 30)
        self._reader.join(5)


@pytest.fixture(scope="session")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    """The model server and the gateway in front of it, for the whole session."""
    env = {
        "MORTRED_AUTH_TOKEN": INTERNAL_TOKEN,
        "MORTRED_REQUEST_READ_TIMEOUT": str(int(READ_DEADLINE_S * 1000)),
    }
    conf = f"conf/server/fake/{MODEL.lower()}.toml"
    model_auth = b"Authorization: Bearer " + INTERNAL_TOKEN.encode() + b"\r\n"
    from tests.control.plane import API_TOKEN, control_plane

    sup_toml = f"read_timeout_s = {READ_DEADLINE_S}"
    sup_tmp = tmp_path_factory.mktemp("security-supervisor")
    with (
        model_server(conf, env=env) as srv,
        control_plane(sup_tmp, [], supervisor_toml=sup_toml) as plane,
    ):
        gateway = GatewayProcess(tmp_path_factory.mktemp("security"), srv.port)
        try:
            gateway.wait_listening()
            plane.wait_ready(["gateway"])
            yield {
                # The supervisor's POST route: its try-it proxy (the rows' bodies
                # name no server, so a framed request that gets through is a 404).
                "supervisor": Target(
                    "supervisor", plane.api_port, b"/api/v1/infer",
                    b"Authorization: Bearer " + API_TOKEN.encode() + b"\r\n", plane.process,
                    empty_post_status=404,
                ),
                "model": Target("model", srv.port, b"/jobs", model_auth, srv.process),
                "gateway": Target(
                    "gateway", gateway.port, f"/v1/models/{MODEL}/jobs".encode(),
                    b"Authorization: Bearer " + GATEWAY_TOKEN.encode() + b"\r\n",
                    gateway.process,
                ),
            }  # fmt: skip
        finally:
            gateway.stop()
