"""Reactor latency while a real diffusion sampler runs: thread vs process workers.

    .venv/bin/python bench/sampler_reactor.py [--model conf/server/diffusion/ddpm.toml]

Starts the shipped DDPM server pinned to one core, submits a job (4 images at the
default 1000-step schedule, ~10 s), and while it samples, polls ``GET /jobs/{id}`` from
4 keep-alive clients for 3 s. Done once with ``worker_isolation = "thread"`` (the
sampler's Python loop shares the reactor's GIL; model thread at nice +10) and once
with ``"process"``. The figure is the poll latency the API keeps while the model works.
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

BODY = json.dumps(
    {"images": [base64.b64encode(b"x").decode()], "params": {"seed": 1, "num_images": 4}}
).encode()
HEADERS = {"Content-Type": "application/json"}


async def polls_while_sampling(port: int, seconds: float) -> tuple[Stats, str]:
    conn = await Connection("127.0.0.1", port).open()
    resp = await conn.request("POST", "/jobs", BODY, HEADERS)
    job = resp.json()["job_id"]
    resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=50")  # let it start
    assert resp.json()["state"] in ("pending", "running")

    async def poll(c: Connection) -> float:
        latency, _resp = await timed(c, "GET", f"/jobs/{job}")
        return latency

    stats = await run_clients("127.0.0.1", port, 4, poll, duration_s=seconds)
    state = (await conn.request("GET", f"/jobs/{job}")).json()["state"]
    await conn.close()
    return stats, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="conf/server/diffusion/ddpm.toml")
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    print("| workers | polls | p50 ms | p99 ms | polls/s | job still sampling at the end |")
    print("|---|---|---|---|---|---|")
    for isolation in ("thread", "process"):
        env = {"MORTRED_WORKER_ISOLATION": isolation}
        launcher = ("taskset", "-c", args.server_cpus)
        with model_server(args.model, env=env, launcher=launcher) as srv:
            stats, state = asyncio.run(polls_while_sampling(srv.port, args.seconds))
        print(
            f"| {isolation} | {stats.count} | {stats.pct(50):.2f} | {stats.pct(99):.2f} | "
            f"{stats.rate:,.0f} | {state == 'running'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
