"""How fast a cancel gives the compute back: DELETE of a running job → job terminal.

For each model (a real model server per model, started from its catalog config, memory
store, one worker): submit a job long enough to run many steps, follow its progress,
and once a few steps have passed, send ``DELETE /jobs/{id}`` while a ``/wait`` is
parked on the job. Reported per model, over ``--repeats`` runs:

* **step**: the model's own time per progress step, measured from the step
  timestamps the event stream delivers (the bound the contract promises: within one
  step);
* **cancel → terminal**: from the DELETE's send to the parked waiter's answer
  (``state: cancelled``), i.e. until the worker is free again (the terminal transition
  happens when the model thread returns);
* **over one step**: cancel → terminal minus one step (target ≤ 50 ms).

Run from the project root (it starts its own servers on free loopback ports)::

    .venv/bin/python bench/cancel_latency.py --models DDPM,DDIM,LDM,SAM_AMG

Figures are reported in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import RunningServer, model_server  # noqa: E402

CONFIGS = {
    "DDPM": ("conf/server/diffusion/ddpm.toml", {"sample_steps": 1000}),
    "DDIM": ("conf/server/diffusion/ddim.toml", {"sample_steps": 1000}),
    "CLS_COND_DDIM": ("conf/server/diffusion/cls_cond_ddim.toml", {"sample_steps": 1000}),
    "LDM": ("conf/server/diffusion/ldm.toml", {"sample_steps": 1000}),
    "SAM_AMG": (
        "conf/server/segment_anything/sam_amg.toml",
        {"points_per_side": 64, "points_per_batch": 64},
    ),
    "FAKE": ("conf/server/fake/fake_async.toml", {"delay_ms": 60_000, "steps": 600}),
}


def demo_image() -> str:
    """A small RGB picture for models that read images (SAM)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (64, 64), (20, 20, 20))
    draw = ImageDraw.Draw(img)
    draw.ellipse((8, 8, 30, 30), fill=(200, 40, 40))
    draw.rectangle((36, 30, 58, 56), fill=(40, 200, 40))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def follow_events(
    port: int, job: str, stamps: list[tuple[float, int]], stop: threading.Event
) -> None:
    """Record (time, step) of every progress event of ``job`` until it ends."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.sendall(
        f"GET /jobs/{job}/events HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
    )
    buf = b""
    with sock:
        while not stop.is_set():
            data = sock.recv(65536)
            if not data:
                return
            now = time.perf_counter()
            buf += data
            *records, buf = buf.split(b"\n\n")
            for record in records:
                for line in record.split(b"\n"):
                    if line.startswith(b"data: "):
                        doc = json.loads(line[6:])
                        if doc.get("progress"):
                            stamps.append((now, doc["progress"]["step"]))


def one_run(srv: RunningServer, params: dict[str, Any], image: str, min_steps: int) -> dict:
    status, doc = srv.json("POST", "/jobs", {"images": [image], "params": params})
    assert status == 202, doc
    job = doc["job_id"]
    stamps: list[tuple[float, int]] = []
    stop = threading.Event()
    reader = threading.Thread(target=follow_events, args=(srv.port, job, stamps, stop), daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while len(stamps) < min_steps and time.monotonic() < deadline:
        time.sleep(0.005)
    answer: dict[str, Any] = {}

    def park() -> None:
        answer["doc"] = srv.json("GET", f"/jobs/{job}/wait?timeout=300000")[1]
        answer["at"] = time.perf_counter()

    waiter = threading.Thread(target=park)
    waiter.start()
    time.sleep(0.05)  # the waiter is parked before the cancel is sent
    sent = time.perf_counter()
    code, _ = srv.json("DELETE", f"/jobs/{job}")
    waiter.join(600)
    stop.set()
    steps = [b[0] - a[0] for a, b in itertools.pairwise(stamps) if b[1] == a[1] + 1]
    step_s = statistics.median(steps) if steps else float("nan")
    return {
        "delete_status": code,
        "state": answer["doc"]["state"],
        "step_ms": step_s * 1000,
        "cancel_ms": (answer["at"] - sent) * 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="DDPM,DDIM,LDM,SAM_AMG")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-steps", type=int, default=5, help="steps to see before cancelling")
    args = p.parse_args()
    image = demo_image()
    print(f"{'model':<14} {'step ms':>8} {'cancel→terminal ms (median / max)':>34} "
          f"{'over one step ms (median / max)':>32}  states")  # fmt: skip
    for name in args.models.split(","):
        conf, params = CONFIGS[name]
        env = {"MORTRED_WORKER_NUMS": "1", "MORTRED_ID": f"CANCEL_{name}",
               "MORTRED_ASYNC_ENABLED": "true", "MORTRED_ASYNC_TIMEOUT": "0"}  # fmt: skip
        with model_server(conf, env=env) as srv:
            runs = [one_run(srv, params, image, args.min_steps) for _ in range(args.repeats)]
        step = statistics.median(r["step_ms"] for r in runs)
        cancel = [r["cancel_ms"] for r in runs]
        over = [r["cancel_ms"] - r["step_ms"] for r in runs]
        states = ",".join(sorted({f"{r['delete_status']}:{r['state']}" for r in runs}))
        print(f"{name:<14} {step:>8.1f} {statistics.median(cancel):>20.1f} / {max(cancel):<11.1f}"
              f" {statistics.median(over):>18.1f} / {max(over):<11.1f}  {states}")  # fmt: skip


if __name__ == "__main__":
    main()
