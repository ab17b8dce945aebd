"""Benchmarks of the shared (Redis) job store.

    .venv/bin/python bench/replicas.py client [--n 5000]

``client``: the Redis client on the reactor (txredisapi through
``runtime/redis_link.RedisLink``) against a local ``redis-server`` started for the
run: sequential ``GET`` and ``EVALSHA`` (the job-snapshot script) round trips,
p50/p99 in µs, and the rate of ``n`` commands issued at once (pipelined on one
connection). Prints a Markdown table; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_client(url: str, n: int) -> list[tuple[str, str]]:
    from twisted.internet import reactor
    from twisted.internet.defer import gatherResults

    from mortred_twisted.config.server import parse_redis_url
    from mortred_twisted.jobs.redis_scripts import key_prefix
    from mortred_twisted.runtime.redis_link import RedisLink

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
    print("| txredisapi 1.6 on the reactor, local redis-server | |")
    print("|---|---|")
    for label, value in out:
        print(f"| {label} | {value} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    client = sub.add_parser("client", help="the Redis client's round trip and rate")
    client.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    if args.what == "client":
        run_client(args.n)


if __name__ == "__main__":
    main()
