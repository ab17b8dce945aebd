"""Dynamic batching on the sync path, through the real server (docs/benchmarks.md).

    .venv/bin/python bench/batching.py [--duration 5] [--clients 16]

Starts the shipped MOBILENETV2 and YOLOV8 servers (``twistd -n mortred-model``) pinned
to ``--server-cpus``, once with ``max_batch_size = 1`` (every request its own forward
pass) and once as shipped (``max_batch_size = 8``, ``max_batch_delay_ms = 2``), and
drives ``POST <server_uri>`` with ``--clients`` concurrent keep-alive clients posting
demo pictures. Prints latency and throughput per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.httpload import Connection, Stats, run_clients, timed  # noqa: E402
from tests.support.servers import model_server  # noqa: E402

MODELS = {
    "MOBILENETV2": (
        "conf/server/classification/mobilenetv2.toml",
        "/mortred/classification/mobilenetv2",
        "demo_data/perception/digit_3.png",
    ),
    "YOLOV8": (
        "conf/server/object_detection/yolov8.toml",
        "/mortred/object_detection/yolov8",
        "demo_data/perception/scene_1.png",
    ),
}


async def drive(port: int, uri: str, body: bytes, clients: int, duration: float) -> Stats:
    headers = {"Content-Type": "application/json"}

    async def step(conn: Connection) -> float:
        latency, resp = await timed(conn, "POST", uri, body, headers=headers)
        assert resp.status == 200, resp.body[:200]
        return latency

    await run_clients("127.0.0.1", port, clients, step, duration_s=1.0)  # warm-up
    return await run_clients("127.0.0.1", port, clients, step, duration_s=duration)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    rows = []
    for model in args.models.split(","):
        config, uri, picture = MODELS[model]
        image = base64.b64encode((ROOT / picture).read_bytes()).decode()
        body = json.dumps({"images": [image]}).encode()
        for batch in (1, 8):
            env = {"MORTRED_MAX_BATCH_SIZE": str(batch), "MORTRED_MAX_QUEUE_DEPTH": "1024"}
            launcher = ("taskset", "-c", args.server_cpus)
            with model_server(config, env=env, launcher=launcher) as srv:
                stats = asyncio.run(drive(srv.port, uri, body, args.clients, args.duration))
            rows.append(
                f"| {model} | {batch} | {args.clients} | {stats.pct(50):.1f} | "
                f"{stats.pct(99):.1f} | {stats.rate:,.0f} | {stats.errors} |"
            )
            print(rows[-1], flush=True)
    print()
    print(f"server pinned to CPU {args.server_cpus}, client to CPU {args.client_cpus}")
    print("| model | max_batch_size | clients | p50 ms | p99 ms | images/s | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
