"""The fake-model server config the benchmarks run against (one place for all of them)."""

from __future__ import annotations


def bench_server_toml(port: int = 18199, fake_steps: int = 10, preload_torch: bool = False) -> str:
    """A 2-worker fake-model server with async jobs and queues that never refuse.

    ``preload_torch``: the fake imports torch while loading, as a real torch model
    does (the CPU-bound scenarios need it; otherwise torch would be imported on the
    first run, after the server froze its long-lived objects).
    """
    return f"""[server]
id = "BENCH"
category = "bench"
host = "127.0.0.1"
port = {port}
server_uri = "/infer"
worker_nums = 2
max_connections = 4096
max_queue_depth = 4096
async_enabled = true
async_timeout = 0
async_max_queue = 100000
async_job_ttl = 300000
async_max_completed = 2000

[model]
type = "fake"
fake_delay_ms = 0
fake_steps = {fake_steps}
fake_preload_torch = {"true" if preload_torch else "false"}
"""
