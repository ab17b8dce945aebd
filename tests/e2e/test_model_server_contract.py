"""End-to-end contract of one model server over real sockets (twistd subprocess).

Covers the seed's ``server_e2e_contract`` list and the model-port cases of the
customer guide (T2–T7, T9, T11, T13, T16) plus the sync path's status codes. Every
job test runs twice: on the in-memory store and on the Redis store (a real
``redis-server`` on a free loopback port, one model id per server). The
fake model's ``params.delay_ms`` sets each job's length, so orderings (202 before
the model finishes) are asserted with seconds of margin, never timed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import RunningServer, model_server
from tests.support.waiting import wait_until

ASYNC_CONF = "conf/server/fake/fake_async.toml"
SYNC_CONF = "conf/server/fake/fake_sync.toml"
IMG = base64.b64encode(b"not really a picture").decode()
TERMINAL = {"done", "failed", "timeout"}


def body(delay_ms: int, **params) -> dict:
    return {"images": [IMG], "req_id": "e2e-1", "params": {"delay_ms": delay_ms, **params}}


def metric(server: RunningServer, name: str, labels: str = "") -> float:
    _s, _h, text = server.request("GET", "/metrics")
    pattern = "^" + re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)$"
    match = re.search(pattern, text.decode(), re.MULTILINE)
    assert match, f"{name}{{{labels}}} not in /metrics"
    return float(match.group(1))


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module", params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> dict[str, str]:
    """The job store a server runs on, as environment overrides."""
    if request.param == "memory":
        return {}
    url = request.getfixturevalue("redis").url
    return {"MORTRED_JOB_STORE": "redis", "MORTRED_REDIS_URL": url}


def on(store: dict[str, str], **env: str) -> dict[str, str]:
    """``env`` plus the store's keys and a model id of its own (servers that share a
    Redis never share a queue)."""
    return {**store, "MORTRED_ID": "fake-" + uuid.uuid4().hex[:8], **env}


@pytest.fixture(scope="module")
def server(store):
    with model_server(ASYNC_CONF, env=on(store)) as srv:
        yield srv


@pytest.fixture(scope="module")
def small_queue_server(store):
    with model_server(ASYNC_CONF, env=on(store, MORTRED_ASYNC_MAX_QUEUE="2")) as srv:
        yield srv


def submit(server: RunningServer, delay_ms: int, **params) -> str:
    status, doc = server.json("POST", "/jobs", body(delay_ms, **params))
    assert status == 202, doc
    return doc["job_id"]


def wait(server: RunningServer, job_id: str, timeout_ms: int = 60_000) -> dict:
    status, doc = server.json("GET", f"/jobs/{job_id}/wait?timeout={timeout_ms}")
    assert status == 200, doc
    return doc


def test_the_port_is_served_by_the_projects_http_server(server) -> None:
    """The model port answers through the one HTTP server (``Server: mortred-model``)."""
    _status, headers, _body = server.request("GET", "/healthz")
    assert headers["server"] == "mortred-model", headers


def test_submit_returns_202_at_admission_while_the_job_is_still_running(server) -> None:
    """T2/T3: the 202 arrives while the model has seconds left; result is 409 meanwhile."""
    status, headers, raw = server.request("POST", "/jobs", body(4000))
    assert status == 202

    doc = json.loads(raw)
    job = doc["job_id"]
    assert job.startswith("job_") and doc["state"] == "pending"
    assert doc["poll_url"] == f"/jobs/{job}" and doc["result_url"] == f"/jobs/{job}/result"
    assert headers["location"] == f"/jobs/{job}"
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["x-request-id"] == "e2e-1"
    poll_status, poll = server.json("GET", f"/jobs/{job}")
    assert poll_status == 200 and poll["state"] in ("pending", "running")
    res_status, res = server.json("GET", f"/jobs/{job}/result")
    assert res_status == 409
    assert re.fullmatch(r"job not finished \(state: (pending|running)\)", res["error"])
    assert wait(server, job)["state"] == "done"


def test_poll_until_done_then_result_is_repeatable(server) -> None:
    """T4/T5: polls see elapsed_ms grow, then /result is 200 twice with the req_id echoed."""
    job = submit(server, 1200)
    elapsed: list[int] = []
    for _ in range(200):  # bounded; each round is paced by a 100 ms wait budget
        doc = wait(server, job, timeout_ms=100)
        elapsed.append(doc["elapsed_ms"])
        if doc["state"] in TERMINAL:
            break
    assert doc["state"] == "done"
    assert len(elapsed) >= 3 and elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]
    for _ in range(2):
        status, env = server.json("GET", f"/jobs/{job}/result")
        assert status == 200
        assert env["code"] == 0 and env["msg"] == "success" and env["req_id"] == "e2e-1"
        assert env["data"]["model"] == "fake" and env["data"]["images"] == 1


def test_wait_wakes_on_terminal_not_on_running(server) -> None:
    """T6: a long wait returns the terminal state, not 'running'."""
    job = submit(server, 800)
    assert wait(server, job, timeout_ms=120_000)["state"] == "done"


def test_wait_budget_expiry_returns_current_nonterminal_state(server) -> None:
    """T7: wait?timeout=200 on a 5 s job returns 200 with pending/running."""
    job = submit(server, 5000)
    doc = wait(server, job, timeout_ms=200)
    assert doc["state"] in ("pending", "running")
    assert wait(server, job)["state"] == "done"


def test_two_concurrent_waiters_both_wake_with_the_same_state(server) -> None:
    """T8: two clients waiting on one job both get 200 and the same terminal state."""
    job = submit(server, 1000)
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(wait(server, job))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    assert results[0]["state"] == results[1]["state"] == "done"


def test_serial_submits_hit_429_while_jobs_run(small_queue_server) -> None:
    """T9: serial submits beyond async_max_queue get 429 with Retry-After; the queue drains."""
    srv = small_queue_server
    jobs, codes = [], []
    for _ in range(4):
        status, headers, raw = srv.request("POST", "/jobs", body(2000))
        codes.append(status)
        if status == 202:
            import json

            jobs.append(json.loads(raw)["job_id"])
        else:
            assert b"async queue full (max 2)" in raw
            assert headers["retry-after"] == "1"
    assert codes == [202, 202, 429, 429]
    for job in jobs:
        assert wait(srv, job)["state"] == "done"
    assert metric(srv, "mortred_async_queue_depth") == 0
    assert submit(srv, 0)


def test_unknown_job_is_404_on_every_job_route(server) -> None:
    """T11: poll, wait and result of an unknown id are 404 'job not found'."""
    for suffix in ("", "/wait?timeout=10", "/result"):
        status, doc = server.json("GET", f"/jobs/job_does_not_exist{suffix}")
        assert status == 404 and doc["error"] == "job not found: job_does_not_exist"


def test_wrong_method_is_405_with_allow(server) -> None:
    """T13: POST on a job URL is 405 and says which methods are allowed."""
    job = submit(server, 0)
    status, headers, _raw = server.request("POST", f"/jobs/{job}", body(0))
    assert status == 405 and {"DELETE", "GET"} <= set(headers["allow"].split(", "))
    status, headers, _raw = server.request("PUT", "/jobs", body(0))  # GET /jobs lists
    assert status == 405 and {"GET", "POST"} <= set(headers["allow"].split(", "))


def test_malformed_envelope_is_422_and_admits_nothing(server) -> None:
    """T16: an invalid envelope is 422 before admission; the queue depth does not move."""
    before = metric(server, "mortred_async_jobs_total", 'state="submitted"')
    status, doc = server.json("POST", "/jobs", {"not": "the envelope"})
    assert status == 422 and "job_id" not in doc
    status, doc = server.json("POST", "/jobs", {"images": [IMG], "params": {"delay_mss": 1}})
    assert status == 422 and "params.delay_mss" in doc["error"] and "delay_ms" in doc["error"]
    status, doc = server.json("POST", "/jobs", {"images": ["%%%"]})
    assert status == 422 and "images[0]" in doc["error"]
    status, _h, _b = server.request(
        "POST", "/jobs", b"{not json", {"Content-Type": "application/json"}
    )
    assert status == 400
    assert metric(server, "mortred_async_jobs_total", 'state="submitted"') == before


def test_failed_job_reports_error_and_result_is_409(server) -> None:
    """A model exception ends the job failed with a readable error; /result is 409."""
    job = submit(server, 0, fail=True)
    doc = wait(server, job)
    assert doc["state"] == "failed" and "fake model failure" in doc["error"]
    status, res = server.json("GET", f"/jobs/{job}/result")
    assert status == 409 and res["error"] == "job not finished (state: failed)"


def test_job_budget_expiry_ends_in_timeout(store) -> None:
    """async_timeout bounds worker wait + run: a longer job ends in state timeout."""
    with model_server(ASYNC_CONF, env=on(store, MORTRED_ASYNC_TIMEOUT="300")) as srv:
        job = submit(srv, 5000)
        doc = wait(srv, job)
        assert doc["state"] == "timeout" and "async_timeout (300 ms)" in doc["error"]
        assert metric(srv, "mortred_async_jobs_total", 'state="timeout"') == 1
        # the worker comes back when the model stops at its next step: a new job runs
        assert wait(srv, submit(srv, 0))["state"] == "done"


def test_metrics_count_a_job_lifecycle(store) -> None:
    """After one job, /metrics counts submitted, running and done once each."""
    with model_server(ASYNC_CONF, env=on(store)) as srv:
        assert wait(srv, submit(srv, 10))["state"] == "done"
        for state in ("submitted", "running", "done"):
            assert metric(srv, "mortred_async_jobs_total", f'state="{state}"') == 1
        assert metric(srv, "mortred_async_jobs_total", 'state="failed"') == 0
        assert metric(srv, "mortred_async_queue_depth") == 0
        assert metric(srv, "mortred_workers_available") == 2
        assert metric(srv, "mortred_ready") == 1
        assert metric(srv, "mortred_http_requests_total", 'code="202",route="jobs_submit"') == 1


# -- the sync path --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sync_server():
    env = {"MORTRED_MAX_QUEUE_DEPTH": "0", "MORTRED_MODEL_RUN_TIMEOUT": "1500"}
    with model_server(SYNC_CONF, env=env) as srv:
        yield srv


URI = "/mortred/fake_sync/infer"


def test_sync_infer_returns_the_envelope(sync_server) -> None:
    """POST <server_uri> answers 200 with the envelope and the request id header."""
    status, headers, raw = sync_server.request("POST", URI, body(10))

    env = json.loads(raw)
    assert status == 200 and env["code"] == 0 and env["req_id"] == "e2e-1"
    assert headers["x-request-id"] == "e2e-1" and headers["cache-control"] == "no-store"


def test_async_disabled_server_answers_404_on_jobs(sync_server) -> None:
    """T12: /jobs is 404 when async_enabled=false."""
    status, doc = sync_server.json("POST", "/jobs", body(0))
    assert status == 404 and "not enabled" in doc["error"]


def test_sync_error_codes(sync_server) -> None:
    """415, 400, 422, 504 with their business codes, in the envelope."""
    srv = sync_server
    status, _h, raw = srv.request("POST", URI, b"{}", {"Content-Type": "text/plain"})
    assert status == 415 and b'"code":60' in raw
    status, _h, raw = srv.request("POST", URI, b"nope", {"Content-Type": "application/json"})
    assert status == 400 and b'"code":50' in raw
    status, doc = srv.json("POST", URI, {"images": []})
    assert status == 422 and doc["code"] == 52 and doc["data"] is None
    status, doc = srv.json("POST", URI, body(5000))
    assert status == 504 and doc["code"] == 4


def test_sync_backpressure_is_429_with_retry_after(sync_server) -> None:
    """With max_queue_depth=0, a request finding every worker busy is refused with 429."""
    srv = sync_server
    for _ in range(2000):  # bounded: a cancelled run of an earlier test may still be stopping
        if metric(srv, "mortred_workers_busy") == 0:
            break
    results: list[int] = []
    busy = [
        threading.Thread(target=lambda: results.append(srv.request("POST", URI, body(1200))[0]))
        for _ in range(2)
    ]
    for t in busy:
        t.start()
    # Wait (bounded) until both workers are busy, observed through the metrics.
    for _ in range(2000):
        if metric(srv, "mortred_workers_busy") == 2:
            break
    status, headers, _raw = srv.request("POST", URI, body(0))
    for t in busy:
        t.join(30)
    assert status == 429 and headers["retry-after"] == "1"
    assert results == [200, 200]


def send_head_read_all(port: int, extra_headers: str) -> bytes:
    """Send only the head of a 64 MiB JSON POST; read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST {URI} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"{extra_headers}Content-Length: {64 * 1024 * 1024}\r\n\r\n".encode()
        )
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    return response


def test_oversized_body_is_413_before_the_body_is_read(sync_server) -> None:
    """A Content-Length over request_size_limit gets 413 from the headers alone."""
    response = send_head_read_all(sync_server.port, "")
    assert response.startswith(b"HTTP/1.1 413")
    assert b'"code":61' in response


def test_expect_continue_with_an_oversized_body_gets_413_and_no_100(sync_server) -> None:
    """A client asking '100-continue' for a too-large upload gets the 413, never a 100."""
    response = send_head_read_all(sync_server.port, "Expect: 100-continue\r\n")
    assert response.startswith(b"HTTP/1.1 413")
    assert b"100 Continue" not in response


def test_precheck_order_405_before_413(sync_server) -> None:
    """An oversized body on a GET-only route is answered 405, not 413."""
    with socket.create_connection(("127.0.0.1", sync_server.port), timeout=10) as sock:
        sock.sendall(
            b"PUT /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n"
        )
        response = sock.recv(65536)
    assert response.startswith(b"HTTP/1.1 405")


def test_auth_token_is_required_and_health_stays_public(store) -> None:
    """With a token: 401 + WWW-Authenticate without or with a wrong bearer; probes public."""
    with model_server(ASYNC_CONF, env=on(store, MORTRED_AUTH_TOKEN="s3cret")) as srv:
        assert srv.request("GET", "/healthz")[0] == 200
        assert srv.request("GET", "/ready")[0] == 200
        status, headers, _ = srv.request("POST", "/jobs", body(0))
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="Mortred"'
        wrong = {"Authorization": "Bearer nope"}
        assert srv.request("POST", "/jobs", body(0), wrong)[0] == 401
        assert srv.request("GET", "/jobs/job_x", None, wrong)[0] == 401
        good = {"Authorization": "Bearer s3cret"}
        status, doc = srv.json("POST", "/jobs", body(0), headers=good)
        assert status == 202
        status, doc = srv.json("GET", f"/jobs/{doc['job_id']}/wait", headers=good)
        assert status == 200 and doc["state"] == "done"


def test_sigterm_drains_a_running_job_and_answers_its_waiter(store) -> None:
    """On SIGTERM the server lets an in-flight job finish and answers the parked wait."""
    import signal

    with model_server(ASYNC_CONF, env=on(store)) as srv:
        job = submit(srv, 1500)
        outcome: list[dict] = []
        waiter = threading.Thread(target=lambda: outcome.append(wait(srv, job)))
        waiter.start()
        # Stop the server once it counts the parked wait (bounded).
        for _ in range(2000):
            if metric(srv, "mortred_async_waiters") == 1:
                break
        srv.process.send_signal(signal.SIGTERM)
        waiter.join(30)
        # twistd re-raises the signal after a clean shutdown, so the exit status is -15.
        assert srv.process.wait(30) in (0, -signal.SIGTERM)
        assert outcome and outcome[0]["state"] == "done"
        srv.stop()
        assert any("Server Shut Down" in line for line in srv.log)


def test_process_isolated_workers_serve_jobs_and_sync_requests(store) -> None:
    """worker_isolation=process: jobs and /infer work, failures and progress cross over."""
    env = on(store, MORTRED_WORKER_ISOLATION="process")
    with model_server(ASYNC_CONF, env=env) as srv:
        doc = wait(srv, submit(srv, 300))
        assert doc["state"] == "done" and doc["progress"] == {"step": 10, "total": 10}
        failed = wait(srv, submit(srv, 0, fail=True))
        assert failed["state"] == "failed" and "fake model failure" in failed["error"]
        status, env_doc = srv.json("POST", "/mortred/fake/infer", body(0))
        assert status == 200 and env_doc["data"]["model"] == "fake"


def test_chunked_body_growing_past_the_limit_is_cut_off_with_413() -> None:
    """Without a Content-Length, a body that grows past request_size_limit gets 413."""
    with model_server(SYNC_CONF, env={"MORTRED_REQUEST_SIZE_LIMIT": "0.001"}) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(
                f"POST {URI} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n".encode()
            )
            chunk = b"x" * 800
            for _ in range(3):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            response = b""
            while part := sock.recv(65536):
                response += part
        assert response.startswith(b"HTTP/1.1 413")
        # a small body still works on a fresh connection
        assert srv.request("POST", URI, body(0))[0] == 200


def test_sigterm_after_grace_fails_remaining_jobs_and_exits() -> None:
    """With --grace 0, running and queued jobs end failed ('server shutting down'), their
    waiters are answered, the models are asked to stop, and the process exits.
    (Memory store: its jobs die with the process. Redis-store replicas hand their
    jobs back instead: tests/e2e/test_replicas.py.)"""
    import signal

    with model_server(ASYNC_CONF, args=("--grace", "0")) as srv:
        running = [submit(srv, 120_000, steps=1200) for _ in range(2)]
        queued = submit(srv, 120_000, steps=1200)
        outcome: list[dict] = []
        waiter = threading.Thread(target=lambda: outcome.append(wait(srv, queued)))
        waiter.start()
        for _ in range(2000):
            if (
                metric(srv, "mortred_async_waiters") == 1
                and metric(srv, "mortred_workers_busy") == 2
            ):
                break
        srv.process.send_signal(signal.SIGTERM)
        waiter.join(30)
        assert srv.process.wait(30) in (0, -signal.SIGTERM)
        assert outcome and outcome[0]["state"] == "failed"
        assert outcome[0]["error"] == "server shutting down: job abandoned"
        assert running


def _nice_values(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[16])  # field 19 of stat: nice
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_model_threads_run_nicer_than_the_reactor() -> None:
    """After a job ran, the model threads are 10 steps nicer than the reactor thread."""
    with model_server(ASYNC_CONF) as srv:
        assert wait(srv, submit(srv, 0))["state"] == "done"
        nice = _nice_values(srv.process.pid)
        base = nice[srv.process.pid]
        if base >= 19:
            pytest.skip("the server already runs at the lowest priority")
        assert min(19, base + 10) in nice.values()


def test_connections_beyond_max_connections_are_closed_at_once() -> None:
    """With max_connections=2, a third open connection is closed without an answer;
    once one closes, a new one is served."""
    with model_server(ASYNC_CONF, env={"MORTRED_MAX_CONNECTIONS": "2"}) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(2)]
        try:
            for sock in held:  # make sure both are accepted and counted
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as extra:
                try:
                    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    answer = extra.recv(65536)
                except ConnectionResetError:
                    answer = b""  # closed while our request was in flight
                assert answer == b""
        finally:
            for sock in held:
                sock.close()

        def served() -> bool:
            try:
                return srv.request("GET", "/healthz")[0] == 200
            except ConnectionError:
                return False  # the server has not seen a close yet: still full

        wait_until(served, 10, "a free connection slot after closing one")


def test_expired_jobs_leave_an_idle_server(store) -> None:
    """With a short async_job_ttl a finished job is repeatable until the TTL, then
    404, with no further submit to trigger retention (the periodic sweep)."""
    with model_server(ASYNC_CONF, env=on(store, MORTRED_ASYNC_JOB_TTL="400")) as srv:
        job = submit(srv, 0)
        assert wait(srv, job)["state"] == "done"
        assert srv.request("GET", f"/jobs/{job}/result")[0] == 200
        wait_until(
            lambda: srv.request("GET", f"/jobs/{job}")[0] == 404,
            10,
            "the expired job to be evicted without a submit",
        )
