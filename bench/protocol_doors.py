"""Cost of each front door against the native job API (issue 35 item 5), in process
and load-proof: Python calls per request under cProfile (NOTES.md: compare call counts,
not rates, on a loaded VM) and CPU µs, the same model (``bench/door_model.py``), the
real HTTP server on a ``StringTransport``.

    .venv/bin/python bench/protocol_doors.py

Scenarios, each for the native ``POST /jobs`` and the OpenAI door
``POST /v1/images/generations`` with the same inputs (one 1x1 PNG out, inline):
``submit`` (admission only: the OpenAI door with ``Prefer: respond-async``, a
Replicate create) and ``life`` (a whole job: native submit + ``/wait`` + ``/result``;
the OpenAI and OIP doors' held request answered when the job ends; a Replicate
create, the run and one GET of the succeeded prediction).
"""

import cProfile
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads

doc = {
    "server": {
        "id": "PAINT", "server_uri": "/infer", "worker_nums": 1, "async_enabled": True,
        "async_max_queue": 1000000, "async_max_completed": 1000000, "output_files": "inline",
    },
    "model": {"type": "bench.door_model:Painter"},
}  # fmt: skip
config = build_server_config(doc, env={})
clock = threads = factory = None


def build():
    """A fresh server for each scenario (a hand-driven Clock sorts its pending calls
    on every callLater: one scenario's backlog must not tax the next)."""
    global clock, threads, factory
    clock, threads = Clock(), HandThreads()
    rt = ModelRuntime(config, clock=clock, threads=threads, metrics=ServerMetrics(),
                      build_model=create_model)  # fmt: skip
    rt.load_models()
    threads.step()
    app = ModelServerApp(rt)
    factory = ModelPortFactory.for_app(app, clock, on_finished=app.record_request)


def serve():
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def settle():
    for _ in range(100):
        clock.advance(0)
        if not threads.pending:
            clock.advance(0)
            if not threads.pending:
                return
        while threads.pending:
            threads.step()


def post(path, body, extra=b""):
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:18100\r\nContent-Type: application/json\r\n"
        b"%sContent-Length: %d\r\n\r\n" % (path, extra, len(body))
    ) + body


PARAMS = {"prompt": "a red dot", "num_images": 1, "width": 8, "height": 8}
NATIVE = post(b"/jobs", json.dumps({"params": PARAMS}).encode())
DOOR_BODY = json.dumps({"model": "PAINT", "prompt": "a red dot", "size": "8x8"}).encode()
DOOR_ASYNC = post(b"/v1/images/generations", DOOR_BODY, b"Prefer: respond-async\r\n")
DOOR_HELD = post(b"/v1/images/generations", DOOR_BODY)
OIP_BODY = json.dumps({"inputs": [
    {"name": "prompt", "shape": [1], "datatype": "BYTES", "data": ["a red dot"]},
    {"name": "num_images", "shape": [1], "datatype": "INT64", "data": [1]},
    {"name": "width", "shape": [1], "datatype": "INT64", "data": [8]},
    {"name": "height", "shape": [1], "datatype": "INT64", "data": [8]},
]}).encode()  # fmt: skip
OIP_HELD = post(b"/v2/models/PAINT/infer", OIP_BODY)
REPLICATE = post(b"/v1/predictions", json.dumps({"input": PARAMS}).encode())


def submits(raw, status=b"HTTP/1.1 202"):
    def go(n):
        proto, t = serve()
        for _ in range(n):
            proto.dataReceived(raw)
            assert t.value().startswith(status), t.value()[:300]
            t.clear()

    return go


def native_lives(n):
    submitter, sent = serve()
    waiter, woken = serve()
    for _ in range(n):
        submitter.dataReceived(NATIVE)
        job = json.loads(sent.value().partition(b"\r\n\r\n")[2])["job_id"].encode()
        sent.clear()
        waiter.dataReceived(b"GET /jobs/%s/wait HTTP/1.1\r\nHost: localhost\r\n\r\n" % job)
        settle()
        assert b'"done"' in woken.value(), woken.value()[-300:]
        woken.clear()
        submitter.dataReceived(b"GET /jobs/%s/result HTTP/1.1\r\nHost: localhost\r\n\r\n" % job)
        assert sent.value().startswith(b"HTTP/1.1 200"), sent.value()[:300]
        sent.clear()


def door_lives(n):
    proto, t = serve()
    for _ in range(n):
        proto.dataReceived(DOOR_HELD)
        settle()
        assert t.value().startswith(b"HTTP/1.1 200") and b"b64_json" in t.value(), t.value()
        t.clear()


def held_lives(raw, marker):
    def go(n):
        proto, t = serve()
        for _ in range(n):
            proto.dataReceived(raw)
            settle()
            assert t.value().startswith(b"HTTP/1.1 200") and marker in t.value(), t.value()
            t.clear()

    return go


def replicate_lives(n):
    """create (201 at admission), the run, one GET of the succeeded prediction."""
    proto, t = serve()
    for _ in range(n):
        proto.dataReceived(REPLICATE)
        job = json.loads(t.value().partition(b"\r\n\r\n")[2])["id"].encode()
        t.clear()
        settle()
        proto.dataReceived(b"GET /v1/predictions/%s HTTP/1.1\r\nHost: localhost\r\n\r\n" % job)
        assert b'"succeeded"' in t.value(), t.value()[-300:]
        t.clear()


def measure(fn, n):
    build()
    fn(20)  # warm
    profile = cProfile.Profile()
    profile.enable()
    fn(n)
    profile.disable()
    calls = pstats.Stats(profile).total_calls / n
    build()
    fn(20)
    start = time.process_time()
    fn(n)
    return calls, (time.process_time() - start) / n * 1e6


rows = [
    ("submit", "native POST /jobs", submits(NATIVE)),
    ("submit", "openai respond-async", submits(DOOR_ASYNC)),
    ("submit", "replicate create", submits(REPLICATE, b"HTTP/1.1 201")),
    ("life", "native submit+wait+result", native_lives),
    ("life", "openai held until done", door_lives),
    ("life", "oip infer (JSON)", held_lives(OIP_HELD, b'"outputs"')),
    ("life", "replicate create+run+get", replicate_lives),
]
base: dict[str, float] = {}
for scenario, name, fn in rows:
    calls, us = measure(fn, 300)
    ref = base.setdefault(scenario, calls)
    print(
        f"{scenario:6} {name:28} {calls:7.0f} calls/req ({calls / ref - 1:+6.1%})  {us:7.0f} µs CPU"
    )
