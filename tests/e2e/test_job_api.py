"""The job API beyond the seed on a model port, over real sockets: cancel, queue
position, idempotent submit, listing per caller, live events (SSE), signed webhooks.

The fake model's ``params.delay_ms``/``steps`` set each job's length and how often
it checks its cancel flag, so orderings are asserted with seconds of margin. Every
test runs on the in-memory store and on the Redis store (a real ``redis-server`` on a
free loopback port, a model id of its own per server).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mortred_twisted.jobs.webhooks import secret_key, verify
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import RunningServer, model_server

ASYNC_CONF = "conf/server/fake/fake_async.toml"
IMG = base64.b64encode(b"not really a picture").decode()
TOKEN = "internal-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "whsec_" + base64.b64encode(b"e2e webhook secret").decode()


def body(delay_ms: int, steps: int = 10, **extra: Any) -> dict:
    return {"images": [IMG], "params": {"delay_ms": delay_ms, "steps": steps}, **extra}


def submit(srv: RunningServer, delay_ms: int, headers: dict | None = None, **kw: Any) -> str:
    status, doc = srv.json(
        "POST", "/jobs", body(delay_ms, **kw), headers={**AUTH, **(headers or {})}
    )
    assert status == 202, doc
    return doc["job_id"]


def get(srv: RunningServer, path: str, headers: dict | None = None) -> tuple[int, Any]:
    return srv.json("GET", path, headers={**AUTH, **(headers or {})})


def wait(srv: RunningServer, job: str) -> dict:
    status, doc = get(srv, f"/jobs/{job}/wait?timeout=60000")
    assert status == 200, doc
    return doc


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module", params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> dict[str, str]:
    """The job store a server runs on, as environment overrides (own model id)."""
    env = {"MORTRED_ID": "JOBAPI_" + uuid.uuid4().hex[:8]}
    if request.param == "redis":
        env.update(
            MORTRED_JOB_STORE="redis", MORTRED_REDIS_URL=request.getfixturevalue("redis").url
        )
    return env


def own_id(store: dict[str, str]) -> dict[str, str]:
    """The store's settings under a model id of its own: a second server with the
    module server's id would be its replica on Redis and could run its jobs."""
    return {**store, "MORTRED_ID": "JOBAPI_" + uuid.uuid4().hex[:8]}


@pytest.fixture(scope="module")
def server(store: dict[str, str]) -> Iterator[RunningServer]:
    """One worker, a token (so the gateway's principal header is honoured)."""
    env = {**store, "MORTRED_AUTH_TOKEN": TOKEN, "MORTRED_WORKER_NUMS": "1"}
    with model_server(ASYNC_CONF, env=env) as srv:
        yield srv


def test_cancel_pending_and_running_jobs(server: RunningServer) -> None:
    """A pending job cancels at once (200) and never runs; a running one answers 202 and
    ends cancelled at its next step; a finished job is 409; /result names the state."""
    running = submit(server, 60_000, steps=600)  # checks its flag every 100 ms
    pending = submit(server, 100)
    status, doc = get(server, f"/jobs/{pending}")
    assert doc["state"] == "pending" and doc["queue_position"] == 1

    status, doc = server.json("DELETE", f"/jobs/{pending}", headers=AUTH)
    assert status == 200 and doc["state"] == "cancelled"
    assert wait(server, pending)["state"] == "cancelled"

    status, doc = server.json("DELETE", f"/jobs/{running}", headers=AUTH)
    assert status == 202 and doc["state"] == "running" and doc["cancel_requested"] is True
    final = wait(server, running)
    assert final["state"] == "cancelled" and "cancelled by request" in final["error"]

    status, doc = server.json("DELETE", f"/jobs/{running}", headers=AUTH)
    assert status == 409 and doc["error"] == "job already finished (state: cancelled)"
    status, doc = get(server, f"/jobs/{pending}/result")
    assert (
        status == 409 and doc["error"] == "job was cancelled (state: cancelled): it has no result"
    )
    assert server.json("DELETE", "/jobs/job_0123456789abcdef01234567", headers=AUTH)[0] == 404
    assert server.json("DELETE", f"/jobs/{pending}")[0] == 401  # no token
    _s, _h, text = server.request("GET", "/metrics")
    assert 'mortred_async_jobs_total{state="cancelled"} 2.0' in text.decode()
    # The worker is free again: a new job runs to done.
    assert wait(server, submit(server, 50))["state"] == "done"


def test_queue_position_counts_down(server: RunningServer) -> None:
    """Pending jobs report 1, 2 … in admission order; positions move up as jobs start."""
    first = submit(server, 1500, steps=3)
    second, third = submit(server, 50), submit(server, 50)
    assert get(server, f"/jobs/{second}")[1]["queue_position"] == 1
    assert get(server, f"/jobs/{third}")[1]["queue_position"] == 2
    assert "queue_position" not in wait(server, first)
    assert wait(server, third)["state"] == "done"


def test_idempotent_submit_replays_conflicts_and_refuses_bad_keys(server: RunningServer) -> None:
    """The same key and body replay the job (Idempotent-Replayed), another body is 422,
    a malformed key is 400."""
    key = {"Idempotency-Key": "order-42"}
    payload = json.dumps(body(50)).encode()
    hdrs = {**AUTH, **key, "Content-Type": "application/json"}
    s1, h1, raw1 = server.request("POST", "/jobs", payload, headers=hdrs)
    s2, h2, raw2 = server.request("POST", "/jobs", payload, headers=hdrs)
    assert s1 == s2 == 202
    assert json.loads(raw1)["job_id"] == json.loads(raw2)["job_id"]
    assert "idempotent-replayed" not in h1 and h2["idempotent-replayed"] == "true"
    other = json.dumps(body(51)).encode()
    s3, _h, raw3 = server.request("POST", "/jobs", other, headers=hdrs)
    assert s3 == 422 and "Idempotency-Key" in json.loads(raw3)["error"]
    for bad in ("", "has space", "x" * 256):
        status, _h, _r = server.request("POST", "/jobs", payload,
                                        headers={**hdrs, "Idempotency-Key": bad})  # fmt: skip
        assert status == 400


def test_a_client_that_cuts_its_connection_and_retries_gets_one_job(server: RunningServer) -> None:
    """The first submit's connection closes before the 202 is read; the retry with the
    same key replays that job instead of admitting a second one."""
    payload = json.dumps(body(50)).encode()
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nIdempotency-Key: cut-and-retry\r\n"
        f"X-Mortred-Principal: retrier\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head + payload)
        sock.shutdown(socket.SHUT_WR)  # gone before reading anything
    hdrs = {**AUTH, "Idempotency-Key": "cut-and-retry", "X-Mortred-Principal": "retrier",
            "Content-Type": "application/json"}  # fmt: skip
    status, headers, raw = server.request("POST", "/jobs", payload, headers=hdrs)
    assert status == 202 and headers.get("idempotent-replayed") == "true"
    listed = get(server, "/jobs?limit=500", {"X-Mortred-Principal": "retrier"})[1]["jobs"]
    assert [j["job_id"] for j in listed] == [json.loads(raw)["job_id"]]


def test_listing_is_per_principal_newest_first_with_cursor(server: RunningServer) -> None:
    """Each principal lists only its own jobs (an 'all' scope lists everyone's),
    newest first, paged by cursor; bad queries are 400."""
    alice = [submit(server, 10, headers={"X-Mortred-Principal": "alice"}) for _ in range(3)]
    bob = submit(server, 10, headers={"X-Mortred-Principal": "bob"})
    as_alice = {"X-Mortred-Principal": "alice"}
    page = get(server, "/jobs?limit=2", as_alice)[1]
    assert [j["job_id"] for j in page["jobs"]] == [alice[2], alice[1]]
    rest = get(server, f"/jobs?limit=2&cursor={page['next_cursor']}", as_alice)[1]
    assert [j["job_id"] for j in rest["jobs"]] == [alice[0]] and rest["next_cursor"] is None
    admin = {"X-Mortred-Principal": "admin", "X-Mortred-Principal-Scope": "all"}
    everyone = get(server, "/jobs?limit=500", admin)[1]
    ids = [j["job_id"] for j in everyone["jobs"]]
    assert bob in ids and set(alice) <= set(ids)
    for job in alice:
        wait(server, job)
    done = get(server, "/jobs?state=done,failed&limit=500", as_alice)[1]["jobs"]
    assert {j["job_id"] for j in done} == set(alice)
    for bad in ("?limit=0", "?limit=501", "?state=finished", "?cursor=zzz"):
        assert get(server, "/jobs" + bad, as_alice)[0] == 400


def test_principal_header_is_ignored_without_a_token(store: dict[str, str]) -> None:
    """On a port without auth_token anyone could send X-Mortred-Principal: it is ignored
    (the caller is the port itself and sees every job)."""
    with model_server(ASYNC_CONF, env=own_id(store)) as srv:
        status, doc = srv.json("POST", "/jobs", body(10), headers={"X-Mortred-Principal": "eve"})
        assert status == 202
        listed = srv.json("GET", "/jobs", headers={"X-Mortred-Principal": "mallory"})[1]
        assert doc["job_id"] in [j["job_id"] for j in listed["jobs"]]


def read_events(port: int, job: str, first_event: threading.Event) -> list[tuple[str, dict]]:
    """Read a job's event stream to its end over a raw socket (chunked HTTP/1.1)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(
        f"GET /jobs/{job}/events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Accept: text/event-stream\r\nConnection: close\r\n\r\n".encode()
    )
    buf = b""
    events: list[tuple[str, dict]] = []
    with sock:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            buf += data
            for record in buf.split(b"\n\n")[:-1]:
                lines = record.decode().split("\n")
                name = [x[7:] for x in lines if x.startswith("event: ")]
                payload = [x[6:] for x in lines if x.startswith("data: ")]
                if name and payload:
                    events.append((name[0], json.loads(payload[0])))
                    first_event.set()
            buf = buf.rsplit(b"\n\n", 1)[-1]
    return events


def test_event_stream_reports_state_progress_and_the_terminal_event(server: RunningServer) -> None:
    """The first event (the current state) arrives while the job still runs; progress
    events follow; the stream ends after the terminal event."""
    job = submit(server, 2500, steps=5)
    first = threading.Event()
    out: list[list[tuple[str, dict]]] = []
    reader = threading.Thread(target=lambda: out.append(read_events(server.port, job, first)))
    reader.start()
    assert first.wait(30)
    assert get(server, f"/jobs/{job}")[1]["state"] in ("pending", "running")  # not over yet
    reader.join(60)
    events = out[0]
    names = [n for n, _ in events]
    assert names[0] == "state" and names[-1] == "done"
    assert "progress" in names
    steps = [d["progress"]["step"] for n, d in events if n == "progress"]
    assert steps == sorted(steps)
    # A finished job: one terminal event, then the stream ends.
    status, headers, raw = server.request("GET", f"/jobs/{job}/events", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert raw.count(b"event: ") == 1 and b"event: done" in raw


class Receiver(BaseHTTPRequestHandler):
    """Fails the first two attempts of each completed message with 503."""

    log: list[dict] = []
    attempts: dict[str, int] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        doc = json.loads(raw)
        signed = verify(secret_key(SECRET), self.headers["webhook-id"],
                        int(self.headers["webhook-timestamp"]), raw,
                        self.headers["webhook-signature"])  # fmt: skip
        entry = {"id": self.headers["webhook-id"], "state": doc["state"], "signed": signed,
                 "result": doc.get("result")}  # fmt: skip
        seen = Receiver.attempts[entry["id"]] = Receiver.attempts.get(entry["id"], 0) + 1
        if doc["state"] == "done" and seen <= 2:
            entry["answered"] = 503
        else:
            entry["answered"] = 200
        Receiver.log.append(entry)
        self.send_response(entry["answered"])
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_webhooks_are_signed_retried_and_deny_by_default(store: dict[str, str]) -> None:
    """A receiver failing twice still gets the completed event delivered exactly once,
    every delivery signed; a host outside webhook_allowed_hosts is refused with 422."""
    Receiver.log, Receiver.attempts = [], {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    env = {**own_id(store), "MORTRED_WEBHOOK_ALLOWED_HOSTS": f"127.0.0.1/32:{port}",
           "MORTRED_WEBHOOK_SECRET": SECRET}  # fmt: skip
    try:
        with model_server(ASYNC_CONF, env=env) as srv:
            url = f"http://127.0.0.1:{port}/hook"
            status, doc = srv.json("POST", "/jobs", body(300, steps=3, webhook=url))
            assert status == 202
            job = doc["job_id"]
            assert srv.json("GET", f"/jobs/{job}/wait?timeout=60000")[1]["state"] == "done"
            for target in ("http://169.254.169.254/latest", f"http://127.0.0.1:{port + 1}/x",
                           "file:///etc/passwd"):  # fmt: skip
                status, doc = srv.json("POST", "/jobs", body(1, webhook=target))
                assert status == 422 and "webhook" in doc["error"]
            only_completed = body(1, webhook=url, webhook_events_filter=["completed"])
            filtered = srv.json("POST", "/jobs", only_completed)[1]
            srv.json("GET", f"/jobs/{filtered['job_id']}/wait?timeout=60000")

            def delivered(state: str, job_id: str) -> list[dict]:
                return [e for e in Receiver.log if e["state"] == state and e["answered"] == 200
                        and e["id"].startswith(job_id)]  # fmt: skip

            from tests.support.waiting import wait_until

            wait_until(lambda: delivered("done", filtered["job_id"]), 30, "the filtered webhook")
            wait_until(lambda: delivered("done", job), 30, "the completed webhook")
    finally:
        httpd.shutdown()
    ours = [e for e in Receiver.log if e["id"].startswith(job)]
    assert all(e["signed"] for e in Receiver.log)
    done = [e for e in ours if e["state"] == "done"]
    assert [e["answered"] for e in done] == [503, 503, 200]
    assert {e["id"] for e in done} == {f"{job}.completed"}  # one message, retried
    assert done[-1]["result"]["code"] == 0 and done[-1]["result"]["data"]["model"] == "fake"
    assert any(e["state"] == "running" for e in ours)  # the start event
    filtered_log = [e for e in Receiver.log if e["id"].startswith(filtered["job_id"])]
    assert {e["state"] for e in filtered_log} == {"done"}
    assert [e["answered"] for e in filtered_log] == [503, 503, 200]


def test_a_process_worker_that_ignores_cancel_is_killed_after_the_grace() -> None:
    """worker_isolation = process: a one-step 60 s run never checks its flag; after
    cancel_grace_ms its worker process is killed, the job ends cancelled and the
    respawned worker runs the next job."""
    env = {"MORTRED_ID": "GRACE", "MORTRED_WORKER_NUMS": "1",
           "MORTRED_WORKER_ISOLATION": "process", "MORTRED_CANCEL_GRACE_MS": "300"}  # fmt: skip
    with model_server(ASYNC_CONF, env=env) as srv:
        status, doc = srv.json("POST", "/jobs", body(60_000, steps=1))
        assert status == 202, doc
        job = doc["job_id"]
        for _ in range(600):  # bounded: until the worker has taken it
            if srv.json("GET", f"/jobs/{job}")[1]["state"] == "running":
                break
            threading.Event().wait(0.05)
        assert srv.json("DELETE", f"/jobs/{job}")[0] == 202
        final = srv.json("GET", f"/jobs/{job}/wait?timeout=60000")[1]
        assert final["state"] == "cancelled" and "worker process was killed" in final["error"]
        _status, doc = srv.json("POST", "/jobs", body(50, steps=2))
        assert srv.json("GET", f"/jobs/{doc['job_id']}/wait?timeout=60000")[1]["state"] == "done"
