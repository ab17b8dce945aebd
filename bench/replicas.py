"""Benchmarks of the shared (Redis) job store and of replicas behind the gateway.

    .venv/bin/python bench/replicas.py client [--n 5000]
    .venv/bin/python bench/replicas.py fleet [--duration 10]
    .venv/bin/python bench/replicas.py submit [--rounds 3]

``client``: the Redis client on the reactor (hiredis through
``runtime/redis_link.RedisLink``) against a local ``redis-server`` started for the
run: sequential ``GET`` and ``EVALSHA`` (the job-snapshot script) round trips,
p50/p99 in µs, and the rate of ``n`` commands issued at once (pipelined on one
connection).

``fleet``: the supervisor runs the fake model (``fake_delay_ms`` 200 per job,
``worker_nums`` 1) behind the gateway, in three set-ups — memory store with one
process, Redis store with one replica, Redis store with two — against a local
``redis-server``. Rows: end-to-end jobs/s through the gateway (16 clients each
doing submit → wait → result), submit latency with 32 submitters (straight to one
replica, 40 submits each), and wake latency (the job's ``completed_at`` to the
waiter having its answer; with two replicas the job runs on one replica and the
waiter waits on the other, whose only worker is kept busy).

The model ports run the project's one HTTP server (twisted.web is no longer offered;
earlier runs in docs/benchmarks.md compared it). The submit rows pin
the replica to CPU 0 and this client and ``redis-server`` to
CPU 1 (as ``bench/async_api.py`` pins its server and client), and print the
replica's own CPU per submit (``/proc``). With 32 closed-loop submitters the
latency is about 32 × that cost, so the same run also measures a yardstick: a bare
``twisted.web`` resource answering fixed bytes (``bench/bare_server.py``) on the
same core, 32 connections — what this machine allows the smallest possible answer —
and the same answer from the gateway's own llhttp server (``gateway/server.py``), the
cost a model port would have on that stack.

Prints Markdown tables; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proc import cpu_seconds  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_client(url: str, n: int) -> list[tuple[str, str]]:
    from twisted.internet import reactor
    from twisted.internet.defer import gatherResults

    from mortred_twisted.config.server import parse_redis_url
    from mortred_twisted.stores.redis_link import RedisLink
    from mortred_twisted.stores.redis_scripts import key_prefix

    prefix = key_prefix("BENCH")
    link = RedisLink(
        reactor, parse_redis_url(url), channel=prefix + "events", stream=prefix + "queue",
        on_event=lambda _m: None, on_subscribed=lambda: None,
    )  # fmt: skip
    link.start()
    await link.when_connected()
    await link.call("SET", "k", b"x" * 100)
    rows = []
    for label, call in (
        ("GET round trip", lambda: link.call("GET", "k")),
        ("EVALSHA snapshot round trip", lambda: link.script("snapshot", [prefix], ["job_x"])),
    ):
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            await call()
            samples.append((time.perf_counter() - t0) * 1e6)
        p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
        rows.append((label, f"p50 {p50:.0f} µs, p99 {p99:.0f} µs"))
    for label, call in (
        ("GET pipelined", lambda: link.call("GET", "k")),
        ("EVALSHA pipelined", lambda: link.script("snapshot", [prefix], ["job_x"])),
    ):
        t0 = time.perf_counter()
        await gatherResults([call() for _ in range(n)])
        rows.append((label, f"{n / (time.perf_counter() - t0):,.0f} commands/s"))
    await link.stop()
    return rows


def run_client(n: int) -> None:
    from twisted.internet import reactor
    from twisted.internet.defer import ensureDeferred

    from tests.support.redis_server import redis_server

    out: list[tuple[str, str]] = []
    with redis_server() as redis:
        d = ensureDeferred(measure_client(redis.url, n))
        d.addCallback(out.extend)
        d.addErrback(lambda f: f.printTraceback())
        d.addBoth(lambda _: reactor.stop())
        reactor.run()
    print("| RESP (hiredis) on the reactor, local redis-server | |")
    print("|---|---|")
    for label, value in out:
        print(f"| {label} | {value} |")


SERVER_TOML = """[server]
id = "{id}"
category = "bench"
host = "127.0.0.1"
port = 18120
server_uri = "/bench/{id}/infer"
worker_nums = 1
async_enabled = true
async_max_queue = 100000
async_max_completed = 100000
job_store = "{store}"

[model]
type = "fake"
config = "{root}/conf/model/fake/fake.toml"
fake_delay_ms = 200
"""
GW_TOKEN = "bench-gateway-token"
INTERNAL = "bench-internal-token"  # what the gateway (and we, straight) send to models
DIRECT = {"Content-Type": "application/json", "Authorization": f"Bearer {INTERNAL}"}


def _consecutive_free_ports(n: int) -> int:
    import socket

    from tests.support.servers import free_port

    for _ in range(100):
        port = free_port()
        ok = True
        for i in range(1, n):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + i))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no consecutive free ports")


class Fleet:
    """A supervisor with the gateway and ``replicas`` processes of one bench id."""

    def __init__(
        self,
        tmp: Path,
        redis_url: str,
        model_id: str,
        store: str,
        replicas: int,
    ):
        import os
        import subprocess

        from tests.support.servers import free_port

        self.model_id = model_id
        self.api_port, self.gw_port = free_port(), free_port()
        self.port = _consecutive_free_ports(replicas)
        self.replicas = replicas
        catalog = tmp / model_id / "conf" / "server"
        catalog.mkdir(parents=True)
        toml = SERVER_TOML.format(id=model_id, store=store, root=ROOT)
        (catalog / "bench.toml").write_text(toml)
        control = catalog.parent / "mortred.toml"
        control.write_text(
            f'[supervisor]\ncatalog_dir = "{catalog}"\napi_port = {self.api_port}\n'
            f'log_dir = "{tmp / model_id / "logs"}"\nprobe_interval_ms = 100\n'
            f"stop_grace_s = 3\n[gateway]\nport = {self.gw_port}\n"
            f'api_keys = "{tmp / "none.toml"}"\n[servers.{model_id}]\n'
            f"port = {self.port}\nreplicas = {replicas}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
        env.update(
            PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MORTRED_API_TOKEN="bench",
            MORTRED_GATEWAY_AUTH_TOKEN=GW_TOKEN, MORTRED_REDIS_URL=redis_url,
            MORTRED_INTERNAL_TOKEN=INTERNAL,
        )  # fmt: skip
        cmd = [
            sys.executable, "-m", "mortred_twisted.supervisor.launch", "-n", "--pidfile=",
            "--logfile", str(tmp / model_id / "supervisor.log"), "mortred-supervisor",
            "--config", str(control),
        ]  # fmt: skip
        self.process = subprocess.Popen(cmd, cwd=str(tmp), env=env)

    def wait_ready(self) -> None:
        from tests.support.waiting import wait_until

        def ready() -> bool:
            return all(self._ready(self.port + i) for i in range(self.replicas)) and (
                self._ready(self.gw_port, "/healthz")
            )

        wait_until(ready, 120, f"{self.model_id} ready")

    @staticmethod
    def _ready(port: int, path: str = "/ready") -> bool:
        import http.client

        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except OSError:
            return False

    def stop(self) -> None:
        from tests.support.servers import stop_process

        stop_process(self.process, 60)


def _body(delay_ms: int) -> bytes:
    import json

    return json.dumps({"images": ["YmVuY2g="], "params": {"delay_ms": delay_ms}}).encode()


async def e2e_jobs(fleet: Fleet, duration: float, warmup: float = 3.0) -> Any:
    """Jobs/s in steady state: completions between ``warmup`` and ``duration`` seconds
    (16 clients keep the queue full; the tail after the window is not counted)."""
    from bench.httpload import Stats, run_clients

    auth = {"Authorization": f"Bearer {GW_TOKEN}", "Content-Type": "application/json"}
    base = f"/v1/models/{fleet.model_id}/jobs"
    body = _body(200)
    finished: list[float] = []
    start = time.perf_counter()

    async def step(conn: Any) -> float:
        t0 = time.perf_counter()
        resp = await conn.request("POST", base, body, auth)
        assert resp.status == 202, resp.body
        job = resp.json()["job_id"]
        resp = await conn.request("GET", f"{base}/{job}/wait?timeout=120000", b"", auth)
        assert resp.json()["state"] == "done", resp.body
        resp = await conn.request("GET", f"{base}/{job}/result", b"", auth)
        assert resp.status == 200
        finished.append(time.perf_counter() - start)
        return (time.perf_counter() - t0) * 1000.0

    ran = await run_clients("127.0.0.1", fleet.gw_port, 16, step, duration_s=duration)
    window = [t for t in finished if warmup <= t <= duration]
    stats = Stats(latencies_ms=ran.latencies_ms, errors=ran.errors)
    stats.elapsed_s = (duration - warmup) * len(ran.latencies_ms) / max(1, len(window))
    return stats


async def submit_p99(port: int, per_client: int) -> Any:
    from bench.httpload import run_clients, timed

    body, headers = _body(200), DIRECT

    async def step(conn: Any) -> float:
        latency, resp = await timed(conn, "POST", "/jobs", body, headers=headers)
        assert resp.status == 202, resp.body
        return latency

    return await run_clients("127.0.0.1", port, 32, step, requests_per_client=per_client)


async def bare_p99(port: int, per_client: int) -> Any:
    from bench.httpload import run_clients, timed

    async def step(conn: Any) -> float:
        latency, resp = await timed(conn, "GET", "/jobs/x")
        assert resp.status == 200
        return latency

    return await run_clients("127.0.0.1", port, 32, step, requests_per_client=per_client)


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (threads started later inherit it)."""
    import contextlib
    import os

    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


def _replica_pid(fleet: Fleet, port: int) -> int:
    """The supervisor's child serving ``port`` (from its environment)."""
    import subprocess

    children = subprocess.run(
        ["pgrep", "-P", str(fleet.process.pid)], capture_output=True, text=True
    ).stdout.split()
    for pid in children:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"MORTRED_LISTEN_PORT={port}".encode() in env:
            return int(pid)
    raise RuntimeError(f"no replica process on port {port}")


def pinned_submits(fleet: Fleet, redis_pid: int, per_client: int) -> tuple[Any, float]:
    """Submit ×32 with the replica on CPU 0, client and Redis on CPU 1; (stats, the
    replica's CPU µs per submit)."""
    import asyncio
    import os

    pid = _replica_pid(fleet, fleet.port)
    mine = os.sched_getaffinity(0)
    _pin(pid, {0})
    _pin(redis_pid, {1})
    os.sched_setaffinity(0, {1})
    try:
        asyncio.run(submit_p99(fleet.port, 5))  # warm-up
        before = cpu_seconds(pid)
        stats = asyncio.run(submit_p99(fleet.port, per_client))
        cpu_us = (cpu_seconds(pid) - before) / max(1, stats.count) * 1e6
    finally:
        os.sched_setaffinity(0, mine)
        _pin(pid, mine)
        _pin(redis_pid, mine)
    return stats, cpu_us


#: The bare servers measured beside the submits: the stack the model ports run on, and
#: the gateway's llhttp server (what a model port on it could at best save).
YARDSTICKS = (("twisted", "twisted.web"), ("llhttp", "llhttp (the gateway's server)"))


def yardstick(per_client: int, stack: str = "twisted") -> tuple[Any, float]:
    """A bare server (``stack``: ``twisted`` or ``llhttp``, see ``bench/bare_server.py``)
    on CPU 0, 32 connections from CPU 1 (see the docstring)."""
    import asyncio
    import os
    import subprocess
    import tempfile

    from tests.support.servers import free_port

    port = free_port()
    with tempfile.NamedTemporaryFile(suffix=".json") as body:
        body.write(b'{"job_id":"job_x","state":"pending"}')
        body.flush()
        bare = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, str(ROOT / "bench" / "bare_server.py"),
             str(port), body.name, stack],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert bare.stdout is not None
        bare.stdout.readline()
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {1})
        try:
            asyncio.run(bare_p99(port, 5))
            before = cpu_seconds(bare.pid)
            stats = asyncio.run(bare_p99(port, per_client))
            cpu_us = (cpu_seconds(bare.pid) - before) / max(1, stats.count) * 1e6
        finally:
            os.sched_setaffinity(0, mine)
            bare.terminate()
            bare.wait(10)
    return stats, cpu_us


async def wake(fleet: Fleet, jobs: int) -> Any:
    """completed_at → waiter has the answer; cross-process with two replicas."""
    import asyncio

    from bench.httpload import Connection, Stats

    headers = DIRECT
    waiter_port = fleet.port
    conn = await Connection("127.0.0.1", fleet.port).open()
    if fleet.replicas > 1:
        # One replica runs a long job; the other then runs every measured job, and
        # the waiter waits on the busy one.
        resp = await conn.request("POST", "/jobs", _body(600_000), headers)
        blocker = resp.json()["job_id"]
        for _ in range(500):
            resp = await conn.request("GET", f"/jobs/{blocker}", b"", headers)
            if resp.json()["state"] == "running":
                break
            await asyncio.sleep(0.02)
        for i in range(fleet.replicas):
            probe = await Connection("127.0.0.1", fleet.port + i).open()
            metrics = (await probe.request("GET", "/metrics")).body.decode()
            await probe.close()
            if "mortred_workers_busy 1.0" in metrics:
                waiter_port = fleet.port + i
    await conn.close()
    conn = await Connection("127.0.0.1", waiter_port).open()
    stats = Stats()
    started = time.perf_counter()
    for _ in range(jobs):
        resp = await conn.request("POST", "/jobs", _body(30), headers)
        job = resp.json()["job_id"]
        resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=60000", b"", headers)
        doc = resp.json()
        assert doc["state"] == "done", doc
        stats.latencies_ms.append((resp.received_unix - doc["completed_at"]) * 1000.0)
    stats.elapsed_s = time.perf_counter() - started
    await conn.close()
    return stats


def run_fleet(duration: float, per_client: int, wake_jobs: int) -> None:
    import asyncio
    import shutil
    import tempfile

    from tests.support.redis_server import redis_server

    rows: list[tuple[str, str, Any, str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="mortred-bench-fleet-"))
    try:
        with redis_server() as redis:
            assert redis.process is not None
            for store, replicas in (("memory", 1), ("redis", 1), ("redis", 2)):
                fleet = Fleet(tmp, redis.url, f"B_{store}_{replicas}", store, replicas)
                try:
                    fleet.wait_ready()
                    label = f"{store}, {replicas} process(es)"
                    rows.append((label, "e2e jobs/s through the gateway",
                                 asyncio.run(e2e_jobs(fleet, duration)), ""))  # fmt: skip
                    rows.append((label, "wake: completed_at → waiter answered",
                                 asyncio.run(wake(fleet, wake_jobs)), ""))  # fmt: skip
                    if replicas == 1:
                        stats, cpu_us = pinned_submits(fleet, redis.process.pid, per_client)
                        rows.append((label, "submit ×32 straight to the model (pinned)",
                                     stats, f"{cpu_us:.0f} µs"))  # fmt: skip
                finally:
                    fleet.stop()
        for stack, name in YARDSTICKS:
            stats, cpu_us = yardstick(per_client, stack)
            label = f"yardstick: bare {name} GET ×32 (pinned)"
            rows.append(("—", label, stats, f"{cpu_us:.0f} µs"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        "| store, processes | scenario | n | p50 ms | p99 ms | rate /s | errors "
        "| server CPU per request |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, what, st, cpu in rows:
        print(
            f"| {label} | {what} | {st.count} | {st.pct(50):.2f} | {st.pct(99):.2f} "
            f"| {st.rate:,.1f} | {st.errors} | {cpu} |"
        )


#: (job store, label) of the ``submit`` rows: both stores on the one HTTP server.
SUBMIT_SETUPS = (("memory", "llhttp"), ("redis", "llhttp"))


def run_submits(per_client: int, rounds: int) -> None:
    """The submit rows alone, ``rounds`` times each (fresh processes per round)."""
    import shutil
    import tempfile

    from tests.support.redis_server import redis_server

    print("| round | set-up | n | p50 ms | p99 ms | rate /s | server CPU per request |")
    print("|---|---|---|---|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="mortred-bench-submit-"))
    try:
        for r in range(1, rounds + 1):
            results = []
            with redis_server() as redis:
                assert redis.process is not None
                for store, http in SUBMIT_SETUPS:
                    fleet = Fleet(tmp, redis.url, f"S{r}_{store}", store, 1)
                    try:
                        fleet.wait_ready()
                        stats, cpu = pinned_submits(fleet, redis.process.pid, per_client)
                        results.append((f"{store} store, {http}, submit ×32", stats, cpu))
                    finally:
                        fleet.stop()
            for stack, name in YARDSTICKS:
                stats, cpu = yardstick(per_client, stack)
                results.append((f"bare {name} GET ×32", stats, cpu))
            for what, st, cpu in results:
                print(
                    f"| {r} | {what} | {st.count} | {st.pct(50):.2f} | {st.pct(99):.2f} "
                    f"| {st.rate:,.0f} | {cpu:.0f} µs |",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    client = sub.add_parser("client", help="the Redis client's round trip and rate")
    client.add_argument("--n", type=int, default=5000)
    fleet = sub.add_parser("fleet", help="replicas behind the gateway, memory vs Redis")
    fleet.add_argument("--duration", type=float, default=10.0)
    fleet.add_argument("--submits-per-client", type=int, default=40)
    fleet.add_argument("--wake-jobs", type=int, default=100)
    submit = sub.add_parser(
        "submit",
        help="only the pinned submit rows (memory, Redis) and the yardsticks",
    )
    submit.add_argument("--submits-per-client", type=int, default=40)
    submit.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.what == "client":
        run_client(args.n)
    elif args.what == "submit":
        run_submits(args.submits_per_client, args.rounds)
    else:
        run_fleet(args.duration, args.submits_per_client, args.wake_jobs)


if __name__ == "__main__":
    main()
