"""Fairness on a real model server: caller B's jobs while caller A floods (issue 19).

    .venv/bin/python bench/fair_share.py [--flood 200] [--small 5] [--run-ms 20]
    .venv/bin/python bench/fair_share.py --store redis      # a local redis-server

Starts ``twistd -n mortred-model`` (the fake model, one worker, each job
``--run-ms`` long) with an internal token, so ``X-Mortred-Principal`` names the
caller as the gateway does. Caller ``key:A`` submits ``--flood`` jobs, then
``key:B`` submits ``--small``; prints, for each of B's jobs, its time from B's
submit to its completion and how many of A's jobs finished before it. Run it in a
``git worktree`` of the base commit (FIFO) with the same interpreter for the A/B;
it puts its own checkout first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import model_server  # noqa: E402

TOKEN = "bench-internal"
CONFIG = """[server]
id = "FAIR{suffix}"
category = "bench"
host = "127.0.0.1"
port = 18198
server_uri = "/infer"
worker_nums = 1
async_enabled = true
async_timeout = 0
async_max_queue = 10000
async_max_completed = 20000
job_store = "{store}"

[model]
type = "fake"
fake_delay_ms = 0
fake_steps = 1
"""


def call(conn: http.client.HTTPConnection, method: str, path: str, caller: str,
         body: Any = None) -> Any:  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Mortred-Principal": caller}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, data, headers)
    resp = conn.getresponse()
    raw = resp.read()
    return json.loads(raw) if raw else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=200)
    parser.add_argument("--small", type=int, default=5)
    parser.add_argument("--run-ms", type=int, default=20)
    parser.add_argument("--store", choices=("memory", "redis"), default="memory")
    args = parser.parse_args()
    body = {"images": [base64.b64encode(b"x").decode()], "params": {"delay_ms": args.run_ms}}
    with ExitStack() as stack:
        env = {"MORTRED_AUTH_TOKEN": TOKEN}
        if args.store == "redis":
            from tests.support.redis_server import redis_server

            env["MORTRED_REDIS_URL"] = stack.enter_context(redis_server()).url
        cfg = Path(tempfile.mkdtemp(prefix="mortred-fair-")) / "fair.toml"
        cfg.write_text(CONFIG.format(suffix=int(time.time()) % 100000, store=args.store))
        srv = stack.enter_context(model_server(cfg, env=env, args=("--grace", "0")))
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=600)
        a_jobs = [call(conn, "POST", "/jobs", "key:A", body)["job_id"] for _ in range(args.flood)]
        submitted = time.perf_counter()
        b_jobs = [call(conn, "POST", "/jobs", "key:B", body)["job_id"] for _ in range(args.small)]
        print(f"checkout {ROOT}, {args.store} store: A {args.flood} jobs, then B {args.small}"
              f" ({args.run_ms} ms each, one worker)")  # fmt: skip
        print("| B's job | done after B's submit (s) | A's jobs done before it |")
        print("|---|---|---|")
        for n, job in enumerate(b_jobs, 1):
            status = call(conn, "GET", f"/jobs/{job}/wait?timeout=300000", "key:B")
            seconds = time.perf_counter() - submitted
            ended = status.get("completed_at")
            before = sum(
                1
                for a in a_jobs
                if (s := call(conn, "GET", f"/jobs/{a}", "key:A")).get("completed_at")
                and s["completed_at"] <= ended
            )
            print(f"| {n} | {seconds:.2f} | {before} |", flush=True)


if __name__ == "__main__":
    main()
