"""An autoscaled fleet for end-to-end tests and ``bench/autoscale.py``: the supervisor
(this checkout) runs the fake model between ``min_replicas`` and ``max_replicas``
behind the gateway, its jobs in a real redis-server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.control.plane import API_TOKEN, GW_TOKEN, ControlPlane
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "FAKE_AUTOSCALE"
IMG = "YXV0b3NjYWxl"

SERVER = """[server]
id = "{model}"
category = "fake"
host = "127.0.0.1"
port = {port}
server_uri = "/mortred/fake_autoscale/infer"
worker_nums = 1
async_enabled = true
async_timeout = 600000
async_max_queue = 2000
async_job_ttl = 600000
async_max_completed = 5000
job_store = "redis"
job_lease_ms = 1000
job_max_attempts = 3

"""
#: the fake model (``[model]`` of the server file); tests may serve another
FAKE_MODEL = """[model]
type = "fake"
config = "{root}/conf/model/fake/fake.toml"
fake_delay_ms = 0
"""

#: an SDK model whose start-up waits for a gate file (``%`` the file's path): a test
#: holds a cold start open until it has sent everything, then creates the file
GATED = """[model]
type = "{root}/tests/e2e/sdk_models/gated.py:Gated"
gate = "%s"
"""


def free_run(count: int, avoid: tuple[int, ...] = ()) -> int:
    """A port p with p … p+count-1 all free and none in ``avoid``."""
    for _ in range(100):
        port = free_port()
        ports = range(port, port + count)
        if any(p in avoid for p in ports):
            continue
        ok = True
        for p in ports[1:]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError(f"no {count} consecutive free ports")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


@contextmanager
def autoscaled_fleet(
    tmp: Path, redis_url: str, table: Mapping[str, Any], model: str = FAKE_MODEL
) -> Iterator[tuple[ControlPlane, int]]:
    """The plane and the first replica's port; ``table`` is ``[servers.<MODEL>]``
    (``replicas = N`` for a fixed count, or the autoscale keys); ``model`` the server
    file's ``[model]`` table (``{root}``: this checkout)."""
    count = int(table.get("max_replicas", table.get("replicas", 1)))
    api_port = free_port()
    gw_port = next(p for p in iter(free_port, None) if p != api_port)
    port = free_run(count, avoid=(api_port, gw_port))
    catalog = tmp / "catalog"
    catalog.mkdir(parents=True, exist_ok=True)
    (catalog / "fake_autoscale.toml").write_text(
        (SERVER + model).format(model=MODEL, port=port, root=ROOT)
    )
    conf = tmp / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    lines = [
        "[supervisor]",
        f'catalog_dir = "{catalog}"',
        f"api_port = {api_port}",
        f'log_dir = "{tmp / "logs"}"',
        "probe_interval_ms = 100",
        "stop_grace_s = 10",
        "[gateway]",
        f"port = {gw_port}",
        f'api_keys = "{tmp / "api_keys.toml"}"',
        f"[servers.{MODEL}]",
        f"port = {port}",
        *(f"{k} = {_toml(v)}" for k, v in table.items()),
    ]
    (conf / "mortred.toml").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    env.update(
        PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MORTRED_API_TOKEN=API_TOKEN,
        MORTRED_GATEWAY_AUTH_TOKEN=GW_TOKEN, MORTRED_REDIS_URL=redis_url,
    )  # fmt: skip
    cmd = [
        sys.executable, "-m", "mortred_twisted.supervisor.launch", "-n", "--pidfile=",
        "--logfile=-", "mortred-supervisor", "--config", str(conf / "mortred.toml"),
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd, cwd=str(tmp), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    plane = ControlPlane(process, api_port, gw_port, {MODEL: port}, tmp / "logs")
    try:
        yield plane, port
    finally:
        plane.stop()


def autoscale(plane: ControlPlane) -> dict[str, Any]:
    """The model's ``autoscale`` status entry ({} while the API does not answer)."""
    return plane.status().get(MODEL, {}).get("autoscale") or {}


def submit(
    plane: ControlPlane, delay_ms: int, timeout: float = 60.0
) -> tuple[int, Any, dict[str, str]]:
    """A job through the gateway: ``(status, JSON body, headers)``."""
    doc = {"images": [IMG], "params": {"delay_ms": delay_ms}}
    code, headers, body, _t = plane.gw(
        "POST", f"/v1/models/{MODEL}/jobs", body=doc, timeout=timeout
    )
    return code, json.loads(body) if body else {}, headers


def wait_job(
    plane: ControlPlane, job_id: str, timeout_ms: int = 120_000, retries: int = 0
) -> dict[str, Any]:
    """The job's view once terminal (``/wait``); a wait cut by a replica that went
    away (502/503) is asked again up to ``retries`` times, as a client would."""
    for attempt in range(retries + 1):
        code, _h, body, _t = plane.gw(
            "GET", f"/v1/models/{MODEL}/jobs/{job_id}/wait?timeout={timeout_ms}",
            timeout=timeout_ms / 1000 + 30,
        )  # fmt: skip
        if code in (502, 503) and attempt < retries:
            continue
        assert code == 200, body
        view = json.loads(body)
        if view["state"] in ("pending", "running") and attempt < retries:
            continue  # woken by a draining replica: its current view
        return view
    raise AssertionError("unreachable")
