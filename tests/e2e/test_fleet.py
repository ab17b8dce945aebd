"""A fleet: the supervisor runs two replicas of one model id behind the gateway,
their jobs in a real redis-server (conf/replicas: what ``make run-replicas`` runs)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mortred_twisted.cli import mortredctl
from tests.control.plane import API_TOKEN, GW_TOKEN, ControlPlane, call
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MODEL = "FAKE_REPLICAS"
IMG = "cmVwbGljYQ=="

pytestmark = pytest.mark.slow


def two_free_ports(avoid: tuple[int, ...] = ()) -> int:
    """A port p with p+1 free too (the two replicas' ports), neither in ``avoid``
    (ports already handed out but not bound yet are free to the OS too)."""
    import socket

    for _ in range(50):
        port = free_port()
        if port in avoid or port + 1 in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@contextmanager
def fleet(tmp: Path, redis: RedisServer) -> Iterator[tuple[ControlPlane, int]]:
    api_port = free_port()
    gw_port = next(p for p in iter(free_port, None) if p != api_port)
    port = two_free_ports(avoid=(api_port, gw_port))
    conf = tmp / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "mortred.toml").write_text(
        "\n".join(
            [
                "[supervisor]",
                f'catalog_dir = "{ROOT / "conf" / "replicas" / "server"}"',
                f"api_port = {api_port}",
                f'log_dir = "{tmp / "logs"}"',
                "probe_interval_ms = 100",
                "[gateway]",
                f"port = {gw_port}",
                f'api_keys = "{tmp / "api_keys.toml"}"',
                f"[servers.{MODEL}]",
                f"port = {port}",
                "replicas = 2",
            ]
        )
        + "\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    env.update(
        PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MORTRED_API_TOKEN=API_TOKEN,
        MORTRED_GATEWAY_AUTH_TOKEN=GW_TOKEN, MORTRED_REDIS_URL=redis.url,
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


def submit(plane: ControlPlane) -> str:
    doc = {"images": [IMG], "params": {"delay_ms": 20}}
    status, _h, body, _t = plane.gw("POST", f"/v1/models/{MODEL}/jobs", body=doc)
    assert status == 202, body
    return json.loads(body)["job_id"]


def ran(port: int) -> int:
    _s, _h, text, _t = call(port, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith('mortred_async_jobs_total{state="running"}'):
            return int(float(line.split()[-1]))
    return 0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_two_replicas_behind_the_gateway_share_200_jobs(tmp_path: Path, redis) -> None:
    """200 jobs from 16 clients through the gateway: each replica runs >= 35 %, every
    job ends done once; status shows the two replicas; with one replica stopped,
    submits still succeed (the gateway skips the refusing one)."""
    with fleet(tmp_path, redis) as (plane, port):
        status = plane.wait_ready(["gateway", MODEL])[MODEL]
        assert [r["id"] for r in status["replicas"]] == [f"{MODEL}@1", f"{MODEL}@2"]
        wait_until(lambda: plane.status()[MODEL]["ready_replicas"] == 2, 60, "both replicas")
        table = io.StringIO()
        argv = ["--addr", f"http://127.0.0.1:{plane.api_port}", "--token", API_TOKEN, "status"]
        assert mortredctl.main(argv, table) == 0
        rows = [line.split()[0] for line in table.getvalue().splitlines()[1:]]
        assert rows[-3:] == [MODEL, f"{MODEL}@1", f"{MODEL}@2"]
        states: list[str] = []
        lock = threading.Lock()

        def client() -> None:
            for _ in range(200 // 16 + 1):
                with lock:
                    if len(states) >= 200:
                        return
                    states.append("")
                    slot = len(states) - 1
                job = submit(plane)
                code, _h, body, _t = plane.gw(
                    "GET", f"/v1/models/{MODEL}/jobs/{job}/wait?timeout=60000"
                )
                assert code == 200, body
                states[slot] = json.loads(body)["state"]

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert states == ["done"] * 200
        first, second = ran(port), ran(port + 1)
        assert first + second == 200 and min(first, second) >= 70, (first, second)
        assert redis.command("GET", f"mortred:{{{MODEL}}}:depth") == "0"

        code, _h, _b, _t = plane.api("POST", f"/api/v1/servers/{MODEL}@1/stop")
        assert code == 202
        wait_until(lambda: plane.status()[MODEL]["ready_replicas"] == 1, 30, "one replica")
        for _ in range(6):
            submit(plane)
