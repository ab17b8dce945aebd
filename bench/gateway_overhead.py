"""Gateway overhead: the same calls direct to the model port and through the gateway.

    .venv/bin/python bench/gateway_overhead.py [--server-cpus 0] [--gateway-cpus 0] \
        [--client-cpus 1] [--client wrk|python] [--duration 3] [--connections 1,16,64]

Starts a fake model server (``fake_delay_ms = 0``, async on) and a gateway in front
of it (``twistd -n mortred-gateway`` with a bearer token, an internal token and a
persistent upstream pool), pinned with ``taskset`` to ``--server-cpus`` and
``--gateway-cpus``. The load comes from ``wrk`` (one thread, keep-alive; Debian's
``wrk`` package, installed by ``make bench-gateway``) or, with ``--client python``
or when ``wrk`` is missing, from the keep-alive asyncio client in
:mod:`bench.httpload`; either runs pinned to ``--client-cpus``.

Where the gateway runs decides what is measured on a small machine:

* ``--gateway-cpus`` = the model's core (the default): every gateway µs is taken from
  the model; the ratio is then at most model CPU / (model + gateway CPU) per request,
  the pessimistic case;
* ``--gateway-cpus`` = the client's core: the model keeps a core to itself in both
  runs and the gateway shares the load generator's (wrk spends ~10 µs of CPU per
  request), the nearest this 2-core machine comes to a gateway with its own core.

In one run, for each connection count, alternately direct and through the gateway:

* ``GET /jobs/{id}`` of a done job (the poll path; the issue's target: added p50 ≤ 2 ms
  and gateway throughput ≥ 60 % of direct);
* ``POST /jobs``: a submit (202) of a zero-delay job (the 202 path, URL rewriting
  included);
* ``POST <server_uri>`` sync infer with a zero-delay model.

Prints a Markdown table: added p50/p99 = gateway minus direct; ratio = gateway
throughput / direct throughput in this run; CPU µs/req of the model (direct) and of
the gateway process (read from /proc, so they hold even on a loaded machine); "ratio,
own core" = the throughput ratio those CPU costs predict when the gateway has a core
of its own (model CPU per request / the busier process's). Nothing here is a
pass/fail test.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.configs import bench_server_toml  # noqa: E402
from bench.httpload import Connection, run_clients, timed  # noqa: E402
from bench.proc import cpu_seconds  # noqa: E402
from tests.support.servers import free_port, model_server  # noqa: E402

TOKEN = "bench-gateway-token"
INTERNAL = "bench-internal-token"
BODY = json.dumps({"images": [base64.b64encode(b"bench").decode()]}).encode()
JSON = {"Content-Type": "application/json"}


@dataclass
class Gateway:
    port: int
    pid: int


@contextmanager
def gateway(tmp: Path, model_port: int, cpus: str) -> Iterator[Gateway]:
    """A gateway process for a one-entry catalog pointing at ``model_port``."""
    catalog = tmp / "conf" / "server"
    catalog.mkdir(parents=True)
    (catalog / "bench.toml").write_text(bench_server_toml(model_port, fake_steps=1))
    port = free_port()
    (tmp / "conf" / "mortred.toml").write_text(
        f'[supervisor]\ncatalog_dir = "{catalog}"\n'
        f'[gateway]\nport = {port}\napi_keys = "{tmp / "none.toml"}"\n'
        "max_connections = 4096\nmax_persistent_per_host = 128\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")},
        "PYTHONPATH": str(ROOT),
        "MORTRED_GATEWAY_AUTH_TOKEN": TOKEN,
        "MORTRED_INTERNAL_TOKEN": INTERNAL,
    }
    cmd = [
        "taskset", "-c", cpus, sys.executable, "-m", "mortred_twisted.supervisor.launch",
        "-n", "--pidfile=", "--logfile=-", "mortred-gateway",
        "--config", str(tmp / "conf" / "mortred.toml"),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "HTTPServerFactory starting on" in line:
                started.set()
        started.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not started.wait(30) or proc.poll() is not None:
            raise RuntimeError("gateway did not start")
        yield Gateway(port, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


async def prepare_job(port: int) -> str:
    conn = await Connection("127.0.0.1", port).open()
    try:
        resp = await conn.request(
            "POST", "/jobs", BODY, {**JSON, "Authorization": f"Bearer {INTERNAL}"}
        )
        assert resp.status == 202, resp.body
        job = resp.json()["job_id"]
        resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=10000",
                                  headers={"Authorization": f"Bearer {INTERNAL}"})  # fmt: skip
        assert resp.json()["state"] == "done"
        return str(job)
    finally:
        await conn.close()


@dataclass
class Load:
    """One load run: latency percentiles (ms), throughput and non-200 answers."""

    p50: float
    p99: float
    count: int
    rate: float
    errors: int

    def pct(self, q: int) -> float:
        return self.p50 if q == 50 else self.p99


#: wrk's Lua hook: the request (method, body, headers) and one parseable result line.
WRK_SCRIPT = """
wrk.method = os.getenv("BENCH_METHOD")
local body = os.getenv("BENCH_BODY")
if body ~= "" then wrk.body = body end
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN")
if wrk.method == "POST" then wrk.headers["Content-Type"] = "application/json" end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKRESULT %d %d %d %.1f %.1f\\n", summary.requests,
    summary.duration, e.status + e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_load(port: int, method: str, path: str, token: str, clients: int, duration: float,
             cpus: str) -> Load:  # fmt: skip
    """Run wrk (one thread, ``clients`` keep-alive connections) pinned to ``cpus``."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    env = {
        **os.environ,
        "BENCH_METHOD": method,
        "BENCH_BODY": BODY.decode() if method == "POST" else "",
        "BENCH_TOKEN": token,
    }
    cmd = ["taskset", "-c", cpus, "wrk", "-t1", f"-c{clients}", f"-d{max(1, round(duration))}s",
           "--timeout", "10s", "-s", script.name, f"http://127.0.0.1:{port}{path}"]  # fmt: skip
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    line = next(ln for ln in out.splitlines() if ln.startswith("WRKRESULT"))
    count, micros, errors, p50, p99 = (float(x) for x in line.split()[1:])
    return Load(p50 / 1000, p99 / 1000, int(count), count / (micros / 1e6), int(errors))


async def python_load(port: int, method: str, path: str, token: str, clients: int,
                      duration: float) -> Load:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", **(JSON if method == "POST" else {})}
    body = BODY if method == "POST" else b""

    async def step(conn: Connection) -> float:
        latency, resp = await timed(conn, method, path, body, headers=headers)
        assert resp.status in (200, 202), (resp.status, resp.body[:200])
        return latency

    stats = await run_clients("127.0.0.1", port, clients, step, duration_s=duration)
    return Load(stats.pct(50), stats.pct(99), stats.count, stats.rate, stats.errors)


#: --client-cpus when wrk is the client; None: the Python client (in this process).
WRK_CPUS: list[str | None] = [None]


async def load(port: int, method: str, path: str, token: str, clients: int, duration: float
               ) -> Load:  # fmt: skip
    cpus = WRK_CPUS[0]
    if cpus is not None:
        return await asyncio.to_thread(wrk_load, port, method, path, token, clients, duration, cpus)
    return await python_load(port, method, path, token, clients, duration)


@dataclass
class Cell:
    """One measurement and the CPU the model and gateway processes spent on it."""

    stats: Load
    model_us: float  # model CPU µs per request
    gateway_us: float  # gateway CPU µs per request


async def measured(pids: tuple[int, int], *args: Any) -> Cell:
    before = [cpu_seconds(p) for p in pids]
    stats = await load(*args)
    after = [cpu_seconds(p) for p in pids]
    n = max(1, stats.count)
    return Cell(stats, (after[0] - before[0]) / n * 1e6, (after[1] - before[1]) / n * 1e6)


def row(name: str, clients: int, direct: Cell, via: Cell) -> str:
    d, v = direct.stats, via.stats
    ratio = v.rate / d.rate if d.rate else float("nan")
    # With the gateway on a core of its own, throughput is bounded by the busier process.
    own_core = min(1.0, direct.model_us / max(via.gateway_us, via.model_us, 1e-9))
    return (
        f"| {name} | {clients} | {d.pct(50):.2f} / {d.pct(99):.2f} | "
        f"{v.pct(50):.2f} / {v.pct(99):.2f} | "
        f"{v.pct(50) - d.pct(50):+.2f} / {v.pct(99) - d.pct(99):+.2f} | "
        f"{d.rate:.0f} | {v.rate:.0f} | {ratio:.0%} | "
        f"{direct.model_us:.0f} | {via.gateway_us:.0f} | {own_core:.0%} | {d.errors + v.errors} |"
    )


async def queue_depth(port: int) -> float:
    """The model's ``mortred_async_queue_depth`` (admitted jobs not yet terminal)."""
    conn = await Connection("127.0.0.1", port).open()
    try:
        resp = await conn.request("GET", "/metrics",
                                  headers={"Authorization": f"Bearer {INTERNAL}"})  # fmt: skip
    finally:
        await conn.close()
    for line in resp.body.decode().splitlines():
        if line.startswith("mortred_async_queue_depth "):
            return float(line.split()[1])
    raise RuntimeError("no mortred_async_queue_depth in the model's metrics")


async def settle(model_port: int) -> None:
    """Wait until every submitted job has finished: a submit cell leaves a backlog
    that the next cells' sync calls would queue behind (workers are shared)."""
    for _ in range(1200):  # bounded: 120 s
        if await queue_depth(model_port) == 0:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the model's job queue did not drain")


async def scenario(model_port: int, gw_port: int, pids: tuple[int, int], connections: list[int],
                   duration: float) -> list[str]:  # fmt: skip
    rows = []
    for clients in connections:
        for name, method, direct_path, gw_path in (
            ("GET /jobs/{id}", "GET", "/jobs/{job}", "/v1/models/BENCH/jobs/{job}"),
            ("POST /jobs (submit, 202)", "POST", "/jobs", "/v1/models/BENCH/jobs"),
            ("POST infer (0 ms model)", "POST", "/infer", "/v1/models/BENCH/infer"),
        ):
            if "{job}" in direct_path:
                # A fresh done job each time: LRU retention may have dropped the last.
                job = await prepare_job(model_port)
                direct_path, gw_path = (p.format(job=job) for p in (direct_path, gw_path))
            await load(model_port, method, direct_path, INTERNAL, clients, 0.5)  # warm-up
            await load(gw_port, method, gw_path, TOKEN, clients, 0.5)
            await settle(model_port)
            direct = await measured(
                pids, model_port, method, direct_path, INTERNAL, clients, duration
            )
            await settle(model_port)
            via = await measured(pids, gw_port, method, gw_path, TOKEN, clients, duration)
            await settle(model_port)
            rows.append(row(name, clients, direct, via))
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--gateway-cpus", default=None, help="default: --server-cpus")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--connections", default="1,16,64")
    ap.add_argument("--client", choices=("wrk", "python"), default=None,
                    help="load generator (default: wrk when installed)")  # fmt: skip
    args = ap.parse_args()
    client = args.client or ("wrk" if shutil.which("wrk") else "python")
    if client == "wrk":
        if not shutil.which("wrk"):
            ap.error("wrk is not installed (apt-get install wrk, or make bench-gateway)")
        WRK_CPUS[0] = args.client_cpus
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    connections = [int(c) for c in args.connections.split(",")]
    gw_cpus = args.gateway_cpus or args.server_cpus
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        cfg = tmp / "model.toml"
        cfg.write_text(bench_server_toml(18199, fake_steps=1))
        env = {"MORTRED_AUTH_TOKEN": INTERNAL}
        with model_server(cfg, env=env, launcher=("taskset", "-c", args.server_cpus)) as srv, \
                gateway(tmp / "gw", srv.port, gw_cpus) as gw:  # fmt: skip
            print(f"model :{srv.port} on cpus {args.server_cpus}, gateway :{gw.port} on "
                  f"cpus {gw_cpus}, {client} client on cpus {args.client_cpus}, "
                  f"{args.duration} s per cell\n")  # fmt: skip
            print("| call | conns | direct p50/p99 ms | gateway p50/p99 ms | added p50/p99 ms "
                  "| direct req/s | gateway req/s | ratio | model CPU µs/req "
                  "| gateway CPU µs/req | ratio, own core | errors |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            pids = (srv.process.pid, gw.pid)
            asyncio.run(scenario(srv.port, gw.port, pids, connections, args.duration))


if __name__ == "__main__":
    main()
