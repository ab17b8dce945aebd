"""Benchmark of the async job API and the sync path (the figures of docs/benchmarks.md).

    .venv/bin/python bench/async_api.py [--server-cpus 0] [--client-cpus 1] [--duration 3]
        [--only submit-idle,submit,wake,poll,e2e,sync]

Starts real model servers (``twistd -n mortred-model``, the fake model) pinned to
``--server-cpus`` with ``taskset`` and drives them from this process pinned to
``--client-cpus``, with a keep-alive asyncio client. Scenarios:

1. submit (202) latency, 32 concurrent submitters: pool idle (workers sleeping),
   every worker busy on CPU-bound torch work (``fake_mode=cpu``), and every worker
   busy on pure-Python work that holds the GIL (``fake_mode=python``);
2. wake latency: server-side terminal timestamp (``completed_at``) to the waiting
   client receiving its response;
3. ``GET /jobs/{id}`` throughput at 1/16/64 connections, and a bare twisted.web
   resource serving the same bytes in the same run (the ratio), with each server's
   CPU per request (``/proc``: much less blurred by a loaded VM than the rates);
4. end-to-end jobs/s with a zero-delay model (submit + wait + result), 16 clients,
   and the server's CPU per job;
5. sync-path overhead: ``/infer`` latency minus the model's own run time
   (``Server-Timing: model;dur=``), p50/p99.

Prints a Markdown table; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.configs import bench_server_toml  # noqa: E402
from bench.httpload import Connection, Stats, run_clients, timed  # noqa: E402
from bench.proc import cpu_seconds  # noqa: E402
from tests.support.servers import free_port, model_server  # noqa: E402

IMG = base64.b64encode(b"bench").decode()
JSON_HEADERS = {"Content-Type": "application/json"}

CONFIG = bench_server_toml(preload_torch=True)  # the CPU scenarios run torch


def job_body(delay_ms: int, mode: str = "sleep", steps: int = 10) -> bytes:
    params = {"delay_ms": delay_ms, "mode": mode, "steps": steps}
    return json.dumps({"images": [IMG], "params": params}).encode()


@contextmanager
def server(cfg: Path, cpus: str, isolation: str = "thread", nice: int = 10):
    env = {"MORTRED_WORKER_ISOLATION": isolation, "MORTRED_WORKER_NICE": str(nice)}
    launcher = ("taskset", "-c", cpus)
    with model_server(cfg, env=env, launcher=launcher, args=("--grace", "0")) as srv:
        yield srv


async def metric(port: int, name: str) -> float:
    conn = await Connection("127.0.0.1", port).open()
    try:
        resp = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    match = re.search(rf"^{re.escape(name)} (\S+)$", resp.body.decode(), re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


async def submit_latency(port: int, busy_mode: str | None, per_client: int) -> Stats:
    """32 submitters; optionally every worker first busy with ``busy_mode`` work."""
    if busy_mode is not None:
        conn = await Connection("127.0.0.1", port).open()
        for _ in range(2):
            busy = job_body(120_000, busy_mode, steps=2000)
            resp = await conn.request("POST", "/jobs", busy, JSON_HEADERS)
            assert resp.status == 202, resp.body
        await conn.close()
        for _ in range(500):  # bounded: until both workers run the busy jobs
            if await metric(port, "mortred_workers_busy") == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # let the burn reach steady state
    body = job_body(120_000, "sleep", steps=2000)

    async def step(conn: Connection) -> float:
        latency, resp = await timed(conn, "POST", "/jobs", body, headers=JSON_HEADERS)
        assert resp.status == 202, resp.status
        return latency

    return await run_clients("127.0.0.1", port, 32, step, requests_per_client=per_client)


async def wake_latency(port: int, jobs_per_client: int) -> Stats:
    body = job_body(30)

    async def step(conn: Connection) -> float:
        resp = await conn.request("POST", "/jobs", body, JSON_HEADERS)
        assert resp.status == 202
        job = resp.json()["job_id"]
        resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=60000")
        doc = resp.json()
        assert doc["state"] == "done", doc
        return (resp.received_unix - doc["completed_at"]) * 1000.0

    return await run_clients("127.0.0.1", port, 8, step, requests_per_client=jobs_per_client)


async def poll_throughput(port: int, path: str, clients: int, duration: float) -> Stats:
    async def step(conn: Connection) -> float:
        latency, resp = await timed(conn, "GET", path)
        assert resp.status == 200
        return latency

    return await run_clients("127.0.0.1", port, clients, step, duration_s=duration)


async def end_to_end(port: int, duration: float) -> Stats:
    body = job_body(0)

    async def step(conn: Connection) -> float:
        t0 = time.perf_counter()
        resp = await conn.request("POST", "/jobs", body, JSON_HEADERS)
        assert resp.status == 202, resp.body
        job = resp.json()["job_id"]
        resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=60000")
        assert resp.json()["state"] == "done"
        resp = await conn.request("GET", f"/jobs/{job}/result")
        assert resp.status == 200
        return (time.perf_counter() - t0) * 1000.0

    return await run_clients("127.0.0.1", port, 16, step, duration_s=duration)


async def sync_overhead(port: int, count: int) -> Stats:
    body = json.dumps({"images": [IMG], "params": {"delay_ms": 0}}).encode()

    async def step(conn: Connection) -> float:
        latency, resp = await timed(conn, "POST", "/infer", body, headers=JSON_HEADERS)
        assert resp.status == 200
        model_ms = float(resp.headers["server-timing"].split("dur=")[1])
        return latency - model_ms

    return await run_clients("127.0.0.1", port, 1, step, requests_per_client=count)


#: what ``--only`` can name
SCENARIOS = ("submit-idle", "submit", "wake", "poll", "e2e", "sync")


def with_cpu(pid: int, load: Any) -> tuple[Stats, float]:
    """Run ``load`` (a coroutine giving Stats); also µs of ``pid``'s CPU per request."""
    before = cpu_seconds(pid)
    stats = asyncio.run(load)
    return stats, (cpu_seconds(pid) - before) / max(1, stats.count) * 1e6


def row(name: str, stats: Stats, extra: str = "") -> str:
    return (
        f"| {name} | {stats.count} | {stats.pct(50):.2f} | {stats.pct(99):.2f} | "
        f"{stats.rate:,.0f} | {stats.errors} | {extra} |"
    )


def poll_rows(srv: Any, args: argparse.Namespace, tmp: Path, rows: list[str]) -> None:
    """``GET /jobs/{id}`` at 1/16/64 connections, and a bare twisted.web resource
    serving the same bytes, with each server's CPU per request."""
    conn_job = asyncio.run(_one_done_job(srv.port))
    status_path = f"/jobs/{conn_job}"
    body_file = tmp / "status.json"
    body_file.write_bytes(asyncio.run(_get(srv.port, status_path)))
    bare_port = free_port()
    bare = subprocess.Popen(
        ["taskset", "-c", args.server_cpus, sys.executable,
         str(ROOT / "bench" / "bare_server.py"), str(bare_port), str(body_file)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert bare.stdout is not None
    bare.stdout.readline()
    try:
        for clients in (1, 16, 64):
            ours, ours_cpu = with_cpu(
                srv.process.pid, poll_throughput(srv.port, status_path, clients, args.duration)
            )
            base, base_cpu = with_cpu(
                bare.pid, poll_throughput(bare_port, status_path, clients, args.duration)
            )
            ratio = ours.rate / base.rate if base.rate else float("nan")
            note = f"{ratio:.0%} of bare; CPU {ours_cpu:.0f} µs/req = {ours_cpu / base_cpu:.0%}"
            rows.append(row(f"GET /jobs/{{id}}, {clients} conn", ours, note))
            bare_note = f"CPU {base_cpu:.0f} µs/req"
            rows.append(row(f"bare twisted.web, {clients} conn", base, bare_note))
            print(rows[-2], rows[-1], sep="\n", flush=True)
    finally:
        bare.terminate()
        bare.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default="1")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--submits-per-client", type=int, default=40)
    parser.add_argument(
        "--only", default=",".join(SCENARIOS),
        help="comma list of scenarios to run (submit-idle: the idle-pool submit row only)",
    )  # fmt: skip
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(SCENARIOS):
        parser.error(f"--only takes {', '.join(SCENARIOS)}")
    if "submit" in only:
        only.add("submit-idle")
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})

    tmp = Path(tempfile.mkdtemp(prefix="mortred-bench-"))
    cfg = tmp / "bench.toml"
    cfg.write_text(CONFIG)
    rows: list[str] = []

    for label, mode, isolation, nice in (
        ("pool idle (workers sleeping)", None, "thread", 10),
        ("every worker on CPU-bound torch work", "cpu", "thread", 0),
        ("every worker on CPU-bound torch work", "cpu", "thread", 10),
        ("every worker on pure-Python (GIL-holding) work", "python", "thread", 0),
        ("every worker on pure-Python (GIL-holding) work", "python", "thread", 10),
        ("every worker on CPU-bound torch work", "cpu", "process", 10),
        ("every worker on pure-Python (GIL-holding) work", "python", "process", 10),
    ):
        if not ("submit" in only or ("submit-idle" in only and mode is None)):
            continue
        with server(cfg, args.server_cpus, isolation, nice) as srv:
            stats = asyncio.run(submit_latency(srv.port, mode, args.submits_per_client))
        name = f"submit ×32, {label}; {isolation} workers, nice {nice}"
        rows.append(row(name, stats))
        print(rows[-1], flush=True)

    with server(cfg, args.server_cpus) if only & {"wake", "poll"} else nullcontext() as srv:
        if "wake" in only:
            stats = asyncio.run(wake_latency(srv.port, 40))
            rows.append(row("wake: terminal transition → waiter has the response", stats))
            print(rows[-1], flush=True)
        if "poll" in only:
            poll_rows(srv, args, tmp, rows)

    with server(cfg, args.server_cpus) if only & {"e2e", "sync"} else nullcontext() as srv:
        if "e2e" in only:
            stats, cpu_us = with_cpu(srv.process.pid, end_to_end(srv.port, args.duration * 2))
            rows.append(row("end to end: submit+wait+result, zero-delay model, 16 clients",
                            stats, f"rate = jobs/s; server CPU {cpu_us:.0f} µs/job"))  # fmt: skip
            print(rows[-1], flush=True)
        if "sync" in only:
            stats = asyncio.run(sync_overhead(srv.port, 1000))
            rows.append(row("sync /infer overhead (latency − model time), 1 client", stats))
            print(rows[-1], flush=True)

    print()
    print(f"server pinned to CPU {args.server_cpus}, client to CPU {args.client_cpus}; "
          f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}")  # fmt: skip
    print("| scenario | n | p50 ms | p99 ms | rate /s | errors | note |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


async def _one_done_job(port: int) -> str:
    conn = await Connection("127.0.0.1", port).open()
    try:
        resp = await conn.request("POST", "/jobs", job_body(0), JSON_HEADERS)
        job = resp.json()["job_id"]
        await conn.request("GET", f"/jobs/{job}/wait?timeout=60000")
        return job
    finally:
        await conn.close()


async def _get(port: int, path: str) -> bytes:
    conn = await Connection("127.0.0.1", port).open()
    try:
        return (await conn.request("GET", path)).body
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
