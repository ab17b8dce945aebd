"""CPU per request of a model port, in process: ``GET /jobs/{id}`` polls (a done job)
and ``POST /jobs`` submits through the real HTTP server on a ``StringTransport`` (no
sockets, no peer, no scheduler noise: ``time.process_time`` of this process only), and
the whole life of a job (submit, a waiter parked on ``/wait``, the run on the hand-driven
pool and clock, the waiter woken, ``GET /jobs/{id}/result``).

    .venv/bin/python bench/port_cpu.py            # this checkout
    .venv/bin/python bench/port_cpu.py --sdk      # the same job path, an SDK model
    .venv/bin/python bench/port_cpu.py --calls [--sdk]   # Python calls per request
    (cd /tmp/base && /work/main/.venv/bin/python bench/port_cpu.py)   # a worktree

Run it in a ``git worktree`` of another commit with the same interpreter for an A/B
that a loaded VM cannot blur (the socket benches' yardsticks moved 2x within minutes
on 2026-12-02). Prints µs of CPU per request; submits pile up pending (no worker
runs them), so the second submit batch measures a backlog of 5,000 jobs; the job
scenario runs first, while the store holds only finished jobs.
"""

import base64
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())  # the checkout it runs from
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

import mortred_twisted.http.model_port as mp
from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.envelope import new_request_id
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.fake import create as create_fake
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads

doc = {
    "server": {
        "id": "T",
        "server_uri": "/infer",
        "worker_nums": 1,
        "async_enabled": True,
        "async_max_queue": 1000000,
        "async_max_completed": 1000000,
    },
    "model": {"type": "fake", "fake_delay_ms": 0, "fake_steps": 1},
}
SDK = "--sdk" in sys.argv  # bench/sdk_echo.py: the fake's job, declared with the SDK
if SDK:
    doc["model"] = {"type": "bench.sdk_echo:SdkEcho"}
config = build_server_config(doc, env={})
clock, threads = Clock(), HandThreads()
rt = ModelRuntime(
    config,
    clock=clock,
    threads=threads,
    metrics=ServerMetrics(),
    build_model=(lambda t, o, r: create_model(t, o, r))
    if SDK
    else (lambda _t, o, r: create_fake(o, r)),
)
rt.load_models()
threads.step()
app = ModelServerApp(rt)
if hasattr(mp.ModelPortFactory, "for_app"):
    factory = mp.ModelPortFactory.for_app(app, clock, on_finished=app.record_request)
else:
    factory = mp.ModelPortFactory(
        mp.ModelPortApp(app, on_finished=app.record_request),
        clock=clock,
        body_limit=config.request_size_limit_bytes,
        early_reject=app.early_reject,
        request_id=new_request_id,
    )


def serve(factory):
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def settle():
    """Run every queued reactor call and pool call until nothing is left."""
    for _ in range(100):
        clock.advance(0)
        if not threads.pending:
            clock.advance(0)
            if not threads.pending:
                return
        while threads.pending:
            threads.step()


proto, t = serve(factory)
if SDK:
    body = json.dumps({"params": {"data": base64.b64encode(b"x").decode()}}).encode()
else:
    body = json.dumps({"images": [base64.b64encode(b"x").decode()]}).encode()
submit = (
    b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1:18100\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(body)
) + body
proto.dataReceived(submit)
job = json.loads(t.value().partition(b"\r\n\r\n")[2])["job_id"]
settle()
t.clear()
poll = b"GET /jobs/%s HTTP/1.1\r\nHost: 127.0.0.1:18100\r\n\r\n" % job.encode()


def run(raw, n):
    start = time.process_time()
    for _ in range(n):
        proto.dataReceived(raw)
        t.clear()
    return (time.process_time() - start) / n * 1e6


def job_lives(n):
    """CPU per job over its whole life: submit, a waiter parked on /wait, the run,
    the wake, the result fetch (each on its own kept-alive connection)."""
    submitter, sent = serve(factory)
    waiter, woken = serve(factory)
    start = time.process_time()
    for _ in range(n):
        submitter.dataReceived(submit)
        job_id = json.loads(sent.value().partition(b"\r\n\r\n")[2])["job_id"].encode()
        sent.clear()
        wait = b"GET /jobs/%s/wait?timeout=10 HTTP/1.1\r\nHost: localhost\r\n\r\n" % job_id
        waiter.dataReceived(wait)
        settle()
        assert b'"done"' in woken.value(), woken.value()[-300:]
        woken.clear()
        submitter.dataReceived(b"GET /jobs/%s/result HTTP/1.1\r\nHost: localhost\r\n\r\n" % job_id)
        assert sent.value().startswith(b"HTTP/1.1 200"), sent.value()[:300]
        sent.clear()
    return (time.process_time() - start) / n * 1e6


def calls_per(fn, *args, n):
    """Python calls per request under cProfile: exact, whatever loads the machine."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    fn(*args)
    profile.disable()
    return pstats.Stats(profile).total_calls / n


if "--calls" in sys.argv:  # call counts instead of CPU time (a load-proof A/B)
    job_lives(200)
    print(f"job: {calls_per(job_lives, 500, n=500):.0f} calls/job")
    print(f"poll: {calls_per(run, poll, 2000, n=2000):.0f} calls/request")
    print(f"submit: {calls_per(run, submit, 200, n=200):.0f} calls/request")
    sys.exit(0)

gc.freeze()
print(f"job: {job_lives(2000):.1f} us/job (warm-up)")
print(f"job: {job_lives(3000):.1f} us/job")
for name, raw, n in [
    ("poll", poll, 20000),
    ("poll", poll, 20000),
    ("submit", submit, 5000),
    ("submit", submit, 5000),
]:
    print(f"{name}: {run(raw, n):.1f} us/request")
