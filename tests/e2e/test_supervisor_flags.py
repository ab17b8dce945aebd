"""Issue 36.2: a supervisor started with ``--api-port``/``--gateway-port`` other than
its file's: the gateway listens on the flag's port, and its cold-start wakes reach
the supervisor on the flag's API port (before, they went to the file's port, where
nothing listened: every request at zero was an immediate 503 and nobody said why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.plane import API_TOKEN, GW_TOKEN, ControlPlane
from tests.e2e.autoscale_fleet import FAKE_MODEL, IMG, MODEL, SERVER, free_run
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_api_and_gateway_port_flags_reach_the_gateways_wake_calls(
    tmp_path: Path, redis: RedisServer
) -> None:
    file_api, file_gw, api, gw = (free_port() for _ in range(4))
    port = free_run(1, avoid=(file_api, file_gw, api, gw))
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "fake_autoscale.toml").write_text(
        (SERVER + FAKE_MODEL).format(model=MODEL, port=port, root=ROOT)
    )
    conf = tmp_path / "mortred.toml"
    conf.write_text(
        "\n".join(
            [
                "[supervisor]",
                f'catalog_dir = "{catalog}"',
                f"api_port = {file_api}",
                f'log_dir = "{tmp_path / "logs"}"',
                "probe_interval_ms = 100",
                "[gateway]",
                f"port = {file_gw}",
                f'api_keys = "{tmp_path / "api_keys.toml"}"',
                f"[servers.{MODEL}]",
                f"port = {port}",
                "min_replicas = 0",
                "max_replicas = 1",
                "cold_start_timeout_s = 90",
                "autoscale_interval_s = 0.25",
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
        "--logfile=-", "mortred-supervisor", "--config", str(conf),
        "--api-port", str(api), "--gateway-port", str(gw),
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    plane = ControlPlane(process, api, gw, {MODEL: port}, tmp_path / "logs")
    try:
        plane.wait_ready(["gateway"])
        wait_until(
            lambda: (plane.status().get(MODEL, {}).get("autoscale") or {}).get("active"),
            30,
            "scaler on",
        )
        # A sync call at zero replicas is held, the supervisor woken on the flag's port.
        code, _h, body, _t = plane.gw(
            "POST", "/mortred/fake_autoscale/infer", body={"images": [IMG]}, timeout=120
        )
        assert code == 200, body
        assert json.loads(body)["code"] == 0
        scale = plane.status()[MODEL]["autoscale"]
        assert scale["cold_starts"] == 1, scale
        gateway_log = (tmp_path / "logs" / "gateway.log").read_text()
        assert f"cold starts wake the supervisor at http://127.0.0.1:{api}" in gateway_log
        assert "wake failed" not in gateway_log
    finally:
        plane.stop()
