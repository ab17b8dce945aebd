"""Show the client's retries and idempotent submit against a real model server behind
the fault proxy, with real waits and the client's log (for people, not for pytest)::

    .venv/bin/python -m tests.client.demo_faults
"""

from __future__ import annotations

import logging
import time

from mortred_client import Client, QueueFull, RetryPolicy

from tests.client.proxy import fault_proxy
from tests.support.servers import model_server


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="  client log: %(message)s")
    with model_server("conf/server/fake/fake_async.toml") as srv, fault_proxy(srv.port) as proxy:
        client = Client(proxy.base_url, infer_path="/mortred/fake/infer")
        direct = Client(srv.base_url)

        print("1. the proxy drops the answer of a submit (the job was admitted):")
        proxy.faults = ["drop_answer"]
        job = client.submit([b"x"], {"delay_ms": 100}, req_id="demo-lost")
        posts = [r.split(b"\r\n")[0] for r in proxy.requests if r.startswith(b"POST")]
        keys = {
            line for r in proxy.requests for line in r.split(b"\r\n")
            if line.lower().startswith(b"idempotency-key")
        }  # fmt: skip
        print(f"   POSTs sent: {len(posts)}, distinct Idempotency-Keys: {len(keys)}")
        print(f"   job {job.job_id} replayed={job.replayed}")
        same = [j.job_id for j in direct.jobs() if j.req_id == "demo-lost"]
        print(f"   jobs on the server with req_id demo-lost: {same}")

        print("2. the proxy answers 503 with Retry-After: 1, then with an HTTP date:")
        date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 2))
        proxy.faults = [("status", 503, 1), ("status", 503, date)]
        started = time.monotonic()
        status = job.wait(timeout=30)
        print(f"   wait() -> {status.state} after {time.monotonic() - started:.2f} s")

        print("3. the proxy resets three connections of a GET in a row:")
        proxy.faults = ["reset", "reset", "reset"]
        started = time.monotonic()
        print(f"   status() -> {job.status().state} after {time.monotonic() - started:.2f} s")

        print("4. a sync inference meets a reset: not repeated (it may have run):")
        proxy.faults = ["reset"]
        try:
            client.infer([b"x"], {"delay_ms": 1})
        except Exception as e:
            print(f"   {type(e).__name__}: {e}")

        print("5. a 429 whose Retry-After (30 s) ends past the deadline (10 s): raised at once")
        proxy.faults = [("status", 429, 30)]
        started = time.monotonic()
        try:
            Client(proxy.base_url, retry=RetryPolicy(deadline=10)).job(job.job_id).status()
        except QueueFull as e:
            took = time.monotonic() - started
            print(f"   QueueFull retry_after={e.retry_after} after {took:.2f} s")


if __name__ == "__main__":
    main()
