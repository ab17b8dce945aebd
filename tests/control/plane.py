"""Run the whole control plane (``twistd -n mortred-supervisor``) for end-to-end tests.

The supervisor runs this checkout's code (``PYTHONPATH``), on free loopback ports,
with the repository's catalog (``conf/server``) and a temporary ``conf/mortred.toml``
that enables only the models a test asks for. Everything runs in child processes;
the test process stays reactor-free and talks plain blocking HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mortred_twisted.config.catalog import discover
from tests.support.servers import free_port, stop_process
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
API_TOKEN = "e2e-mgmt-token"
GW_TOKEN = "e2e-gateway-token"


def call(
    port: int,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, dict[str, str], bytes, float]:
    """One request on a fresh connection: ``(status, headers, body, seconds)``."""
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json; charset=utf-8")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        elapsed = time.monotonic() - started
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, elapsed
    finally:
        conn.close()


class ControlPlane:
    """A running supervisor with its gateway and models."""

    def __init__(
        self,
        process: subprocess.Popen[str],
        api_port: int,
        gw_port: int,
        model_ports: dict[str, int],
        log_dir: Path,
    ) -> None:
        self.process = process
        self.api_port = api_port
        self.gw_port = gw_port
        self.model_ports = model_ports
        self.log_dir = log_dir
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def gw(self, method: str, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes, float]:
        kw.setdefault("token", GW_TOKEN)
        return call(self.gw_port, method, path, **kw)

    def api(self, method: str, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes, float]:
        kw.setdefault("token", API_TOKEN)
        return call(self.api_port, method, path, **kw)

    def status(self) -> dict[str, dict[str, Any]]:
        try:
            code, _, body, _ = self.api("GET", "/api/v1/status", timeout=5)
        except OSError:
            return {}
        if code != 200:
            return {}
        return {s["id"]: s for s in json.loads(body)["servers"]}

    def wait_ready(self, ids: list[str], timeout: float = 90.0) -> dict[str, dict[str, Any]]:
        def ready() -> dict[str, dict[str, Any]] | None:
            if self.process.poll() is not None:
                raise AssertionError("supervisor exited:\n" + "".join(self.output[-60:]))
            st = self.status()
            ok = all(st.get(i, {}).get("ready") and st[i]["state"] == "running" for i in ids)
            return st if ok else None

        try:
            return wait_until(ready, timeout, f"{ids} ready")
        except AssertionError as exc:
            states = {i: (s["state"], s["ready"], s["error"]) for i, s in self.status().items()}
            raise AssertionError(f"{exc}; status: {states}") from None

    def child_pids(self) -> list[int]:
        return [s["pid"] for s in self.status().values() if s.get("pid")]

    def stop(self, timeout: float = 60.0) -> int:
        code = stop_process(self.process, timeout)
        self._reader.join(5)
        return code


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def control_plane(
    tmp: Path,
    models: list[str],
    *,
    extra_toml: str = "",
    supervisor_toml: str = "",
    env: Mapping[str, str] | None = None,
    recv_timeout_ms: int = 180000,
    catalog_dir: Path | None = None,
) -> Iterator[ControlPlane]:
    """Start a supervisor that runs the gateway and ``models`` (others disabled) of
    ``catalog_dir`` (the shipped ``conf/server`` by default)."""
    catalog = catalog_dir or ROOT / "conf" / "server"
    entries, problems = discover(catalog, ROOT)
    assert not problems, problems
    api_port, gw_port = free_port(), free_port()
    ports = {e.id: free_port() for e in entries if e.id in models}
    log_dir = tmp / "logs"
    lines = [
        "[supervisor]",
        f'catalog_dir = "{catalog}"',
        f"api_port = {api_port}",
        f'log_dir = "{log_dir}"',
        "probe_interval_ms = 100",
        "stop_grace_s = 10",
        "ready_timeout_s = 120",
        supervisor_toml,
        "[gateway]",
        f"port = {gw_port}",
        f'api_keys = "{tmp / "api_keys.toml"}"',
        f"upstream_recv_timeout_ms = {recv_timeout_ms}",
    ]
    for e in entries:
        lines.append(f"[servers.{e.id}]")
        if e.id in ports:
            lines.append(f"port = {ports[e.id]}")
        else:
            lines.append("enabled = false")
    conf = tmp / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "mortred.toml").write_text("\n".join(lines) + "\n" + extra_toml)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    child_env.update(
        {
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "MORTRED_API_TOKEN": API_TOKEN,
            "MORTRED_GATEWAY_AUTH_TOKEN": GW_TOKEN,
            **(env or {}),
        }
    )
    cmd = [
        sys.executable, "-m", "mortred_twisted.supervisor.launch", "-n", "--pidfile=",
        "--logfile=-", "mortred-supervisor", "--config", str(conf / "mortred.toml"),
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd, cwd=str(tmp), env=child_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    plane = ControlPlane(process, api_port, gw_port, ports, log_dir)
    try:
        yield plane
    finally:
        plane.stop()
