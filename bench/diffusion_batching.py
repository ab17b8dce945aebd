"""Step batching of diffusion jobs: throughput and latency, batched vs one at a time.

    .venv/bin/python bench/diffusion_batching.py [--models DDIM,LDM,TXT2IMG] [--clients 1,4,8,16]
        [--seconds 10] [--capacity 8] [--max-batch-images 32]
        [--scheduler dpmsolver++] [--steps 20] [--json out.json]
    .venv/bin/python bench/diffusion_batching.py --tolerance [--models DDPM,DDIM,...]
    (either: [--device cuda] for a GPU; default cpu)

Per model, two real model servers (``twistd``, memory store, thread workers, one
torch thread, ``worker_nums = 1``) from the catalog config, differing only in:

* **one at a time**: ``max_running_jobs = 1``, ``channels_last = false`` — every job
  runs alone on the worker's thread: the code path and settings before step batching
  (a run alone gives the same bytes, at the same speed, as before);
* **batched**: ``max_running_jobs = --capacity``, ``channels_last`` as shipped —
  running jobs share one denoiser call per step.

For each number of concurrent clients, the modes take turns in ``--slices`` slices
(A B A B …, so both see the same machine), every client looping for ``--seconds`` in
all per mode: ``POST /jobs`` (``--scheduler`` at
``--steps``, one image, a fresh seed) → ``GET /jobs/{id}/wait`` → ``GET
/jobs/{id}/result``; a job's latency is from the submit's send to the result's
arrival. Reported: jobs/s (jobs finished inside the measuring window / the window:
the steady state, without the drain after it), p50 and p99 latency of every job
(ms), the server's CPU per job (its process's user + system time over each slice,
drain included, / every job of the slice: what a job costs whatever share of the
cores the server got, so the figure to compare when other work loads the machine),
and the ratios batched / one at a time. With 1 client the ratio of p50s is "a
job alone against today's".

``TXT2IMG`` (``type = "diffusers"``, a Stable Diffusion layout) sends a prompt per job
(:data:`PROMPT`, guided at the catalog's ``guidance_scale``: two UNet rows per job).

``--tolerance`` measures instead, in process, how far an image sampled in a batch is
from the same seed sampled alone: 16 seeds, each model, three schedulers, max
difference per pixel (of 255) and how many pixels differ at all.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import sys
import tempfile
import time
import tomllib
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.httpload import Connection, Stats  # noqa: E402
from tests.support.servers import RunningServer, model_server  # noqa: E402

SERVERS = {
    "DDPM": "conf/server/diffusion/ddpm.toml",
    "DDIM": "conf/server/diffusion/ddim.toml",
    "CLS_COND_DDIM": "conf/server/diffusion/cls_cond_ddim.toml",
    "LDM": "conf/server/diffusion/ldm.toml",
    # type = "diffusers" (an SDK model): options inline, a prompt per job, no images
    "TXT2IMG": "conf/server/diffusion/txt2img.toml",
}
#: The prompt of the text-to-image rows (each job gets it with its own seed).
PROMPT = "a red circle in the top left on a blue background"
IMG = base64.b64encode(b"ignored by generative models").decode()


def server_toml(model: str, overrides: dict[str, Any], folder: Path, device: str = "cpu") -> Path:
    """The catalog config of ``model`` with model ``overrides`` and queues that never
    refuse during the benchmark (absolute paths: the file lives in /tmp)."""
    doc = tomllib.loads((ROOT / SERVERS[model]).read_text())
    if "config" in doc["model"]:
        options = tomllib.loads((ROOT / doc["model"]["config"]).read_text())
        options["pretrained"] = str(ROOT / options["pretrained"])
    else:  # type = "diffusers": the options are the server file's [model] table
        options = {k: v for k, v in doc["model"].items() if k != "type"}
        options["path"] = str(ROOT / options["path"])
        overrides = {k: v for k, v in overrides.items() if k != "channels_last"}
    options.update(device=device, **overrides)
    server = {
        **doc["server"],
        "worker_nums": 1,
        "torch_threads": 1,
        "async_max_queue": 1024,
        "max_queue_depth": 1024,
        "async_max_completed": 4096,
    }
    lines = ["[server]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in server.items()]
    lines += ["", "[model]", f'type = "{doc["model"]["type"]}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    path = folder / "conf" / f"{model.lower()}_{overrides['max_running_jobs']}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_job(conn: Connection, params: dict[str, Any]) -> float:
    """Submit, wait, fetch the result; the latency in ms (raises on any failure)."""
    envelope: dict[str, Any] = {"req_id": "bench", "params": params}
    if "prompt" not in params:  # the built-in families take the seed envelope's images
        envelope["images"] = [IMG]
    body = json.dumps(envelope).encode()
    hdrs = {"Content-Type": "application/json"}
    t0 = time.perf_counter()
    resp = await conn.request("POST", "/jobs", body, hdrs)
    assert resp.status == 202, resp.body
    job = resp.json()["job_id"]
    resp = await conn.request("GET", f"/jobs/{job}/wait?timeout=300000")
    assert resp.status == 200 and resp.json()["state"] == "done", resp.body
    resp = await conn.request("GET", f"/jobs/{job}/result")
    assert resp.status == 200 and resp.json()["code"] == 0, resp.body[:200]
    return (time.perf_counter() - t0) * 1000.0


async def load(port: int, clients: int, seconds: float, params: dict[str, Any]) -> Stats:
    """``clients`` loops of one job after the other for ``seconds``.

    Throughput is the steady state: ``elapsed_s`` is the window and ``done`` counts the
    jobs *finished inside it*; jobs still running at its end are waited for (their
    latencies count) but not counted, so the drain after the window, where fewer
    clients remain, is measured by neither mode.
    """
    stats = Stats()
    seeds = iter(range(10**9))
    started = time.perf_counter()
    deadline = started + seconds
    done = 0

    async def client() -> None:
        nonlocal done
        conn = await Connection("127.0.0.1", port).open()
        try:
            while time.perf_counter() < deadline:
                try:
                    stats.latencies_ms.append(await one_job(conn, {**params, "seed": next(seeds)}))
                except (AssertionError, ConnectionError, asyncio.IncompleteReadError):
                    stats.errors += 1
                    continue
                if time.perf_counter() <= deadline:
                    done += 1
        finally:
            await conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    stats.elapsed_s = seconds
    stats.done = done  # type: ignore[attr-defined]
    return stats


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    levels = [int(c) for c in args.clients.split(",")]
    rows: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="bench-diffusion-"))
    print("| model | clients | mode | jobs/s | p50 ms | p99 ms | CPU ms/job | jobs | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        params = {"scheduler": args.scheduler, "sample_steps": args.steps}
        if model == "TXT2IMG":
            params["prompt"] = PROMPT
        modes = {
            "one at a time": {"max_running_jobs": 1, "channels_last": False},
            "batched": {
                "max_running_jobs": args.capacity,
                "max_batch_images": args.max_batch_images,
            },
        }
        with ExitStack() as stack:
            servers: dict[str, RunningServer] = {}
            for mode, overrides in modes.items():
                conf = server_toml(model, overrides, folder, args.device)
                srv = stack.enter_context(model_server(conf, wait_ready=False))
                assert "NOT READY" not in srv.wait_ready(timeout=600), "".join(srv.log[-20:])
                servers[mode] = srv
            for srv in servers.values():  # warm-up: allocator, kernels, first-call paths
                asyncio.run(load(srv.port, 2, 1.0, params))
            for clients in levels:
                # Modes alternate in slices (A B A B ...), so a change of the machine's
                # load during the level hits both alike.
                merged = {mode: Stats() for mode in servers}
                finished = dict.fromkeys(servers, 0)
                cpu = dict.fromkeys(servers, 0.0)
                for _ in range(args.slices):
                    for mode, srv in servers.items():
                        before = cpu_seconds(srv.process.pid)
                        part = asyncio.run(
                            load(srv.port, clients, args.seconds / args.slices, params)
                        )
                        cpu[mode] += cpu_seconds(srv.process.pid) - before
                        merged[mode].latencies_ms += part.latencies_ms
                        merged[mode].errors += part.errors
                        merged[mode].elapsed_s += part.elapsed_s
                        finished[mode] += part.done  # type: ignore[attr-defined]
                for mode, stats in merged.items():
                    row = {
                        "model": model, "clients": clients, "mode": mode,
                        "jobs_per_s": round(finished[mode] / stats.elapsed_s, 2),
                        "p50_ms": round(stats.pct(50), 1),
                        "p99_ms": round(stats.pct(99), 1),
                        "cpu_ms_per_job": round(cpu[mode] * 1000.0 / max(1, stats.count), 1),
                        "jobs": stats.count, "errors": stats.errors,
                    }  # fmt: skip
                    rows.append(row)
                    print(
                        f"| {model} | {clients} | {mode} | {row['jobs_per_s']} | "
                        f"{row['p50_ms']} | {row['p99_ms']} | {row['cpu_ms_per_job']} | "
                        f"{row['jobs']} | {row['errors']} |",
                        flush=True,
                    )
    print()
    print(
        "| model | clients | jobs/s batched / one at a time | p50 ratio | p99 ratio "
        "| CPU per job one at a time / batched |"
    )
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for clients in levels:
            one, bat = (
                next(
                    r for r in rows if (r["model"], r["clients"], r["mode"]) == (model, clients, m)
                )
                for m in ("one at a time", "batched")
            )
            print(
                f"| {model} | {clients} | {bat['jobs_per_s'] / one['jobs_per_s']:.2f}x | "
                f"{bat['p50_ms'] / one['p50_ms']:.2f} | {bat['p99_ms'] / one['p99_ms']:.2f} | "
                f"{one['cpu_ms_per_job'] / max(0.1, bat['cpu_ms_per_job']):.2f}x |"
            )
    return rows


def tolerance(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Max pixel difference, 16 seeds sampled alone vs in one batch, per model."""
    import numpy as np
    import torch
    from PIL import Image

    from mortred_twisted.model_api.base import InferenceRequest, RunContext
    from mortred_twisted.models.registry import create_model

    torch.set_num_threads(1)

    def pixels(data: dict[str, Any]) -> list[Any]:
        return [  # built-in families: base64 strings; SDK models: inline result files
            np.asarray(Image.open(io.BytesIO(base64.b64decode(
                b["base64"] if isinstance(b, dict) else b
            )))).astype(np.int16)
            for b in data["images"]
        ]  # fmt: skip

    rows: list[dict[str, Any]] = []
    print("| model | scheduler | steps | max pixel diff (of 255) | pixels differing |")
    print("|---|---|---|---|---|")

    def stepped_together(model: Any, reqs: list[Any]) -> list[Any]:
        """Every request joined to the model's step batch, stepped to the end."""
        batch = model.step_batch()
        for key, req in enumerate(reqs):
            batch.join(key, req, RunContext())
        outcomes: dict[int, Any] = {}
        while batch.active:
            outcomes.update(batch.step())
        return [outcomes[key] for key in range(len(reqs))]

    for name in args.models.split(","):
        doc = tomllib.loads((ROOT / SERVERS[name]).read_text())
        extra: dict[str, Any] = {}
        if "config" in doc["model"]:
            options = tomllib.loads((ROOT / doc["model"]["config"]).read_text())
            model = create_model(name, {**options, "device": args.device}, ROOT)
        else:  # type = "diffusers": a prompt per request, the server file's options
            options = {k: v for k, v in doc["model"].items() if k != "type"}
            model = create_model(doc["model"]["type"], {**options, "device": args.device}, ROOT)
            extra = {"prompt": PROMPT}
        for scheduler, steps in (("dpmsolver++", 20), ("ddim", 50), ("euler-ancestral", 30)):
            params = {"scheduler": scheduler, "sample_steps": steps, **extra}
            reqs = [
                model.validate(InferenceRequest(req_id="t", params={**params, "seed": seed}))
                for seed in range(16)
            ]
            alone = [model.run(r, RunContext()) for r in reqs]
            together = stepped_together(model, reqs)
            diffs = [
                np.abs(a - b)
                for x, y in zip(alone, together, strict=True)
                for a, b in zip(pixels(x), pixels(y), strict=True)
            ]
            row = {
                "model": name, "scheduler": scheduler, "steps": steps,
                "max_diff": int(max(d.max() for d in diffs)),
                "differing": int(sum((d > 0).sum() for d in diffs)),
                "pixels": int(sum(d.size for d in diffs)),
            }  # fmt: skip
            rows.append(row)
            print(
                f"| {name} | {scheduler} | {steps} | {row['max_diff']} | "
                f"{row['differing']} of {row['pixels']} |",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=None)
    parser.add_argument("--clients", default="1,4,8,16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--max-batch-images", type=int, default=32)
    parser.add_argument("--slices", type=int, default=4, help="A/B alternations per level")
    parser.add_argument("--scheduler", default="dpmsolver++")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="model device: cpu or cuda")
    parser.add_argument("--tolerance", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.tolerance:
        args.models = args.models or ",".join(SERVERS)
        rows = tolerance(args)
    else:
        args.models = args.models or "DDIM,LDM"
        rows = measure(args)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": None}, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
