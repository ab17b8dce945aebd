"""Autoscaling under a burst, against fixed replica counts (issue 27).

    .venv/bin/python bench/autoscale.py [--jobs 240] [--delay-ms 100] [--max 3] [--settle 20]

The supervisor runs the fake model (``worker_nums`` 1, each job ``--delay-ms`` long)
on a local ``redis-server``, behind the gateway, in three set-ups, one after the
other in the same run:

* ``fixed min``: ``replicas = 1`` (the fewest that serve);
* ``fixed max``: ``replicas = --max``;
* ``autoscale``: ``min_replicas = 0``, ``max_replicas = --max`` (short windows:
  up 1 s, down 4 s, idle to zero 4 s, cooldown 1 s, checked every 0.25 s). The
  burst arrives at zero replicas: its first submits are held by the gateway while
  the first replica starts (a cold start).

In each, ``--clients`` threads submit ``--jobs`` jobs through the gateway as fast as
they are admitted, then wait for them all. Rows: jobs/s (jobs / first submit to last
done), the p50/p99 wait (``queued_ms``: admission to start, from each job's view),
p99 submit latency (a held submit's included), replica-seconds (replicas up or
starting, sampled every 0.25 s from the burst's start until ``--settle`` seconds
after its end: the cost), the most replicas seen, and for ``autoscale`` the cold-start
time the supervisor measured (first held request to first replica ready) and its
replica start-up time. Default run: about two minutes. Nothing here is a pass/fail
test; numbers move with this VM's load (NOTES.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.autoscale_fleet import MODEL, autoscale, autoscaled_fleet, submit  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

UP_STATES = ("starting", "running", "backoff")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def replicas_up(plane: Any) -> int:
    doc = plane.status().get(MODEL, {})
    members = doc.get("replicas") or [doc]
    return sum(1 for r in members if r.get("state") in UP_STATES and not r.get("stopping"))


def burst(plane: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Submit the burst, wait for every job, sample the replica count meanwhile."""
    jobs: list[str] = []
    submits: list[float] = []
    lock = threading.Lock()
    errors: list[Any] = []
    left = [args.jobs]

    def client() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            t0 = time.monotonic()
            code, doc, _h = submit(plane, args.delay_ms, timeout=120)
            with lock:
                if code == 202:
                    jobs.append(doc["job_id"])
                    submits.append(time.monotonic() - t0)
                else:
                    errors.append((code, doc))

    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), replicas_up(plane)))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    views = []
    for job in jobs:
        code, _h, body, _t = plane.gw(
            "GET", f"/v1/models/{MODEL}/jobs/{job}/wait?timeout=120000", timeout=150
        )
        views.append(json.loads(body) if code == 200 else {"state": f"http {code}"})
    done_at = time.monotonic()
    time.sleep(args.settle)
    stop.set()
    sampler.join(5)
    cost = sum(n * (t1 - t0) for (t0, n), (t1, _n) in itertools.pairwise(samples))
    waits = [float(v["queued_ms"]) for v in views if v.get("queued_ms") is not None]
    done = sum(1 for v in views if v.get("state") == "done")
    return {
        "jobs_s": done / (done_at - started),
        "done": done,
        "errors": len(errors),
        "wait_p50": percentile(waits, 0.5),
        "wait_p99": percentile(waits, 0.99),
        "submit_p99": percentile([s * 1000 for s in submits], 0.99),
        "replica_s": cost,
        "max_replicas": max((n for _t, n in samples), default=0),
    }


def run_mode(name: str, table: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    with (
        redis_server() as redis,
        tempfile.TemporaryDirectory() as tmp,
        autoscaled_fleet(Path(tmp), redis.url, table) as (plane, _port),
    ):
        plane.wait_ready(["gateway"], timeout=120)
        if "max_replicas" in table:
            wait_until(lambda: autoscale(plane).get("active") is True, 60, "scaler on")
        else:
            plane.wait_ready(["gateway", MODEL], timeout=120)
            want = table["replicas"]
            wait_until(lambda: plane.status()[MODEL].get("ready_replicas", 1) == want, 120, "ready")
        row = burst(plane, args)
        row["mode"] = name
        scaled = autoscale(plane)
        row["cold_start_s"] = scaled.get("cold_start_s")
        row["startup_s"] = scaled.get("startup_s")
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=240)
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max", type=int, default=3)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds sampled after")
    args = parser.parse_args()
    modes = [
        ("fixed min (1)", {"replicas": 1}),
        (f"fixed max ({args.max})", {"replicas": args.max}),
        (
            f"autoscale (0..{args.max})",
            {
                "min_replicas": 0,
                "max_replicas": args.max,
                "target_backlog_per_replica": 4,
                "scale_up_window_s": 1,
                "scale_down_window_s": 4,
                "idle_to_zero_s": 4,
                "cooldown_s": 1,
                "autoscale_interval_s": 0.25,
                "cold_start_timeout_s": 60,
            },
        ),
    ]
    rows = [run_mode(name, table, args) for name, table in modes]
    print(
        f"\n{args.jobs} jobs of {args.delay_ms} ms (fake model, 1 worker per replica), "
        f"{args.clients} clients; replica-seconds over the burst + {args.settle:g} s\n"
    )
    print(
        "| set-up | jobs/s | wait p50 ms | wait p99 ms | submit p99 ms | replica-s "
        "| most replicas | cold start s | start-up s | done | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cold = f"{r['cold_start_s']:.2f}" if r["cold_start_s"] is not None else "-"
        startup = f"{r['startup_s']:.2f}" if r["startup_s"] is not None else "-"
        print(
            f"| {r['mode']} | {r['jobs_s']:.1f} | {r['wait_p50']:.0f} | {r['wait_p99']:.0f} "
            f"| {r['submit_p99']:.0f} | {r['replica_s']:.1f} | {r['max_replicas']} | {cold} "
            f"| {startup} | {r['done']} | {r['errors']} |"
        )
    fixed_max = rows[1]
    auto = rows[2]
    if fixed_max["replica_s"]:
        print(
            f"\nautoscale used {auto['replica_s'] / fixed_max['replica_s']:.0%} of fixed max's "
            f"replica-seconds at {auto['jobs_s'] / fixed_max['jobs_s']:.0%} of its jobs/s"
        )
    if statistics.fmean([r["errors"] for r in rows]):
        print("\nsome submits were refused: see the errors column")


if __name__ == "__main__":
    main()
