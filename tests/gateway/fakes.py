"""A scripted model process for gateway unit tests (Klein, in memory via StubTreq).

Behaviour by path, mirroring the model server's contract (docs/contract.md):
``POST /jobs`` → 202 with model-port URLs; ``GET /jobs/job_known`` → 200;
other job ids → 404; ``GET /jobs/<id>/wait`` → a Deferred the test controls;
``POST <server_uri>`` → 200 envelope. ``async_enabled=False`` makes ``/jobs`` 404.
Beyond the seed: ``DELETE /jobs/job_known`` → 202 (running, cancel requested),
``DELETE /jobs/job_pending`` → 200 cancelled, ``DELETE /jobs/job_done`` → 409;
``GET /jobs`` → a one-job listing; a submit whose ``Idempotency-Key`` was seen
before (per ``X-Mortred-Principal``) → the same 202 with ``Idempotent-Replayed: true``;
``GET /jobs/job_known/events`` → a ``text/event-stream`` the test writes to
(:attr:`FakeModel.streams`; cancelled ones land in :attr:`FakeModel.streams_closed`).
``GET /openapi.json`` → :attr:`FakeModel.openapi`.
Every request is recorded (method, path, headers, body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from klein import Klein
from twisted.internet import defer


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeModel:
    server_uri: str = "/mortred/fake/infer"
    async_enabled: bool = True
    seen: list[Seen] = field(default_factory=list)
    waits: list[defer.Deferred[bytes]] = field(default_factory=list)
    submit_status: int = 202
    cancelled: list[str] = field(default_factory=list)
    #: (request, Deferred) of each open event stream: write records, fire to end it
    streams: list[tuple[Any, defer.Deferred[bytes]]] = field(default_factory=list)
    streams_closed: list[str] = field(default_factory=list)
    idempotency: set[tuple[str, str]] = field(default_factory=set)
    #: the body of ``GET /openapi.json`` (200)
    openapi: bytes = b'{"openapi":"3.0.3","info":{"title":"t"},"paths":{}}'

    def resource(self) -> Any:
        app = Klein()
        model = self

        def record(request: Any) -> None:
            hdrs = {
                k.decode("latin-1").lower(): v[0].decode("latin-1")
                for k, v in request.requestHeaders.getAllRawHeaders()
            }
            model.seen.append(
                Seen(request.method.decode(), request.uri.decode(), hdrs, request.content.read())
            )

        def js(request: Any, status: int, doc: Any) -> bytes:
            request.setResponseCode(status)
            request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
            return json.dumps(doc).encode()

        @app.route("/jobs", methods=["POST"])
        def submit(request: Any) -> bytes:
            record(request)
            if not model.async_enabled:
                return js(request, 404, {"error": "not found"})
            if model.submit_status == 429:
                request.setHeader(b"Retry-After", b"1")
                return js(request, 429, {"error": "async queue full (max 8)"})
            request.setHeader(b"Location", b"/jobs/job_abc")
            key = request.getHeader(b"idempotency-key")
            if key is not None:
                scoped = ((request.getHeader(b"x-mortred-principal") or b"").decode(), key.decode())
                if scoped in model.idempotency:
                    request.setHeader(b"Idempotent-Replayed", b"true")
                model.idempotency.add(scoped)
            return js(
                request,
                202,
                {
                    "job_id": "job_abc",
                    "state": "pending",
                    "poll_url": "/jobs/job_abc",
                    "result_url": "/jobs/job_abc/result",
                },
            )

        @app.route("/jobs/<job>", methods=["GET"])
        def poll(request: Any, job: str) -> bytes:
            record(request)
            if job != "job_known":
                return js(request, 404, {"error": f"job not found: {job}"})
            return js(request, 200, {"job_id": job, "state": "running", "elapsed_ms": 5})

        def view(job: str, **extra: Any) -> dict[str, Any]:
            return {"job_id": job, **extra, "poll_url": f"/jobs/{job}",
                    "result_url": f"/jobs/{job}/result"}  # fmt: skip

        @app.route("/jobs/<job>", methods=["DELETE"])
        def cancel(request: Any, job: str) -> bytes:
            record(request)
            if job == "job_known":
                return js(request, 202, view(job, state="running", cancel_requested=True))
            if job == "job_pending":
                return js(request, 200, view(job, state="cancelled"))
            if job == "job_done":
                return js(request, 409, {"error": "job already finished (state: done)"})
            return js(request, 404, {"error": f"job not found: {job}"})

        @app.route("/jobs", methods=["GET"])
        def listing(request: Any) -> bytes:
            record(request)
            jobs = [view("job_b", state="running"), view("job_a", state="done")]
            return js(request, 200, {"jobs": jobs, "next_cursor": None})

        @app.route("/queue", methods=["GET"])
        def queue(request: Any) -> bytes:
            record(request)
            return js(request, 200, {"depth": 0, "pending": 0, "running": 0, "callers": []})

        @app.route("/jobs/<job>/events", methods=["GET"])
        def events(request: Any, job: str) -> Any:
            record(request)
            if job != "job_known":
                return js(request, 404, {"error": f"job not found: {job}"})
            request.setHeader(b"Content-Type", b"text/event-stream; charset=utf-8")
            request.setHeader(b"Cache-Control", b"no-cache")
            request.write(b"retry: 2000\n\n")
            d: defer.Deferred[bytes] = defer.Deferred(lambda _: model.streams_closed.append(job))
            model.streams.append((request, d))
            return d

        @app.route("/jobs/<job>/wait", methods=["GET"])
        def wait(request: Any, job: str) -> defer.Deferred[bytes]:
            record(request)
            d: defer.Deferred[bytes] = defer.Deferred(lambda _: model.cancelled.append(job))
            model.waits.append(d)
            return d

        @app.route("/jobs/<job>/result", methods=["GET"])
        def result(request: Any, job: str) -> bytes:
            record(request)
            return js(request, 409, {"error": "job not finished (state: running)"})

        @app.route("/openapi.json", methods=["GET"])
        def openapi(request: Any) -> bytes:
            record(request)
            request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
            return model.openapi

        @app.route(model.server_uri, methods=["POST"])
        def infer(request: Any) -> bytes:
            record(request)
            request.setHeader(b"X-Request-ID", b"req-from-model")
            return js(request, 200, {"req_id": "r", "code": 0, "msg": "success", "data": {}})

        return app.resource()
