"""A submit at zero replicas: admitted by the gateway at once, or held through the
cold start (issue 27 item 3).

    .venv/bin/python bench/cold_admission.py [--rounds 6]

The supervisor runs the fake model (declared with the SDK, so its replicas publish an
admissible validation twin) with ``min_replicas = 0`` on a local ``redis-server``,
behind the gateway. Each round waits until the id runs no replica, then sends one
submit and measures its latency at the client, and reads the cold-start time the
supervisor measured for that round (first wake → first replica ready). Rounds
alternate: ``admitted`` (the twin is in Redis: the gateway admits the job and answers
202 at once) and ``held`` (the twin key is deleted first: the gateway holds the
submit until the replica is up; the new replica publishes the twin again). Every job
must end ``done``. Rows: median and max 202 latency per mode, and the median cold
start. Nothing here is a pass/fail test; numbers move with this VM's load (NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.autoscale_fleet import IMG, MODEL, autoscale, autoscaled_fleet  # noqa: E402
from tests.e2e.test_autoscale import at_zero  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

TABLE = {
    "min_replicas": 0, "max_replicas": 1, "idle_to_zero_s": 1.5,
    "scale_down_window_s": 1, "cooldown_s": 0.5, "autoscale_interval_s": 0.25,
    "cold_start_max_waiting": 8, "cold_start_timeout_s": 90,
}  # fmt: skip
JOBS = f"/v1/models/{MODEL}/jobs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {"admitted": [], "held": []}
    with (
        redis_server() as redis,
        tempfile.TemporaryDirectory() as tmp,
        autoscaled_fleet(Path(tmp), redis.url, TABLE) as (plane, _port),
    ):
        plane.wait_ready(["gateway"])
        wait_until(lambda: autoscale(plane).get("active") is True, 30, "scaler on")
        body = {"images": [IMG], "params": {"delay_ms": 5}}
        # Round 0 publishes the first twin (nothing is in Redis yet): not counted.
        for n in range(args.rounds + 1):
            wait_until(lambda: at_zero(plane), 90, "at zero")
            mode = "held" if n % 2 == 0 else "admitted"
            if mode == "held":
                redis.command("DEL", f"mortred:{{{MODEL}}}:twin")
            before = autoscale(plane).get("cold_starts", 0)
            code, _h, raw, elapsed = plane.gw("POST", JOBS, body=body, timeout=120)
            assert code == 202, raw
            job = json.loads(raw)["job_id"]
            code, _h, done, _t = plane.gw("GET", f"{JOBS}/{job}/wait?timeout=60000",
                                          timeout=90)  # fmt: skip
            assert json.loads(done)["state"] == "done", done
            wait_until(lambda b=before: autoscale(plane).get("cold_starts", 0) > b, 30, "counted")
            cold = float(autoscale(plane)["cold_start_s"])
            if n:
                rows[mode].append((elapsed * 1000.0, cold))
            print(f"round {n}: {mode:8s} 202 after {elapsed * 1000:8.1f} ms, "
                  f"cold start {cold:.2f} s", flush=True)  # fmt: skip
    print("\n| submit at zero | rounds | 202 p50 ms | 202 max ms | cold start p50 s |")
    print("|---|---|---|---|---|")
    for mode, got in rows.items():
        if not got:
            continue
        lat = [g[0] for g in got]
        cold = [g[1] for g in got]
        print(f"| {mode} | {len(got)} | {statistics.median(lat):.1f} | {max(lat):.1f} | "
              f"{statistics.median(cold):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
