"""Replicas of one model id on the Redis job store, as real processes.

Two (or three) ``twistd -n mortred-model`` processes of the fake model share one
``redis-server`` (AOF on) and one model id. Jobs are pulled by whichever replica has
a free worker; a replica that dies loses its jobs to the others after its lease
(``job_lease_ms``, short here); any replica answers for any job.
"""

from __future__ import annotations

import base64
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import RunningServer, model_server
from tests.support.waiting import wait_until

CONF = "conf/server/fake/fake_async.toml"
IMG = base64.b64encode(b"replica test").decode()
TERMINAL = {"done", "failed", "timeout"}

pytestmark = pytest.mark.slow


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def fleet_env(redis: RedisServer, model_id: str, **extra: str) -> dict[str, str]:
    return {
        "MORTRED_JOB_STORE": "redis",
        "MORTRED_REDIS_URL": redis.url,
        "MORTRED_ID": model_id,
        "MORTRED_JOB_LEASE_MS": "1000",
        "MORTRED_ASYNC_MAX_QUEUE": "500",
        "MORTRED_ASYNC_MAX_COMPLETED": "1000",
        **extra,
    }


def submit(srv: RunningServer, delay_ms: int) -> str:
    doc = {"images": [IMG], "req_id": "rep", "params": {"delay_ms": delay_ms}}
    status, answer = srv.json("POST", "/jobs", doc)
    assert status == 202, answer
    return answer["job_id"]


def wait(srv: RunningServer, job_id: str, timeout_ms: int = 60_000) -> dict:
    status, doc = srv.json("GET", f"/jobs/{job_id}/wait?timeout={timeout_ms}")
    assert status == 200, doc
    return doc


def ran(srv: RunningServer) -> int:
    """How many jobs this replica started (its ``running`` event counter)."""
    _s, _h, text = srv.request("GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith('mortred_async_jobs_total{state="running"}'):
            return int(float(line.split()[-1]))
    return 0


def test_jobs_submitted_to_one_replica_are_shared_by_both(redis: RedisServer) -> None:
    """40 jobs all submitted to A: A and B pull them as their workers free up, each
    runs at least 35 %, every job ends done."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        a = stack.enter_context(model_server(CONF, env=fleet_env(redis, model_id)))
        b = stack.enter_context(model_server(CONF, env=fleet_env(redis, model_id)))
        jobs = [submit(a, 150) for _ in range(40)]
        assert all(wait(b, job)["state"] == "done" for job in jobs)
        share_a, share_b = ran(a), ran(b)
        assert share_a + share_b == 40
        assert min(share_a, share_b) >= 14, (share_a, share_b)
        assert redis.command("GET", f"mortred:{{{model_id}}}:depth") == "0"


def test_wait_on_one_replica_wakes_when_another_finishes(redis: RedisServer) -> None:
    """A /wait parked on A returns 'done' when the job ran on B (A has no free worker)."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    env = fleet_env(redis, model_id)
    with model_server(CONF, env={**env, "MORTRED_WORKER_NUMS": "1"}) as a:
        blocker = submit(a, 3000)  # A's only worker is busy with this one
        wait_until(lambda: a.json("GET", f"/jobs/{blocker}")[1]["state"] == "running",
                   30, "A to run the blocker")  # fmt: skip
        with model_server(CONF, env=env) as b:
            job = submit(a, 300)
            doc = wait(a, job)
            assert doc["state"] == "done"
            assert ran(b) == 1  # B ran it: A's worker was busy


def test_a_killed_replicas_jobs_still_end_exactly_once(redis: RedisServer) -> None:
    """SIGKILL A while it runs jobs: after its lease they are re-run by B (attempt 2);
    every accepted job ends terminal, the depth comes back to 0."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    env = fleet_env(redis, model_id)
    with model_server(CONF, env=env) as a:
        jobs = [submit(a, 2000) for _ in range(2)]  # both of A's workers
        wait_until(lambda: ran(a) == 2, 30, "A to run both jobs")
        a.process.send_signal(signal.SIGKILL)
        a.process.wait(10)
        with model_server(CONF, env=env) as b:
            jobs += [submit(b, 100) for _ in range(3)]
            states = [wait(b, job)["state"] for job in jobs]
            assert states == ["done"] * 5
            for job in jobs[:2]:
                attempt = redis.command("HGET", f"mortred:{{{model_id}}}:job:{job}", "attempt")
                assert attempt == "2"
            assert redis.command("GET", f"mortred:{{{model_id}}}:depth") == "0"


def test_jobs_outlive_a_replica_restart(redis: RedisServer) -> None:
    """Ids stay valid across a replica restart: the new process answers their results."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    env = fleet_env(redis, model_id)
    with model_server(CONF, env=env) as a:
        jobs = [submit(a, 0) for _ in range(3)]
        assert all(wait(a, job)["state"] == "done" for job in jobs)
    with model_server(CONF, env=env) as again:
        for job in jobs:
            status, doc = again.json("GET", f"/jobs/{job}/result")
            assert status == 200 and doc["data"]["model"] == "fake"


def test_sigterm_hands_running_jobs_back_to_the_fleet(redis: RedisServer) -> None:
    """A replica stopped with --grace 0 hands its running job back; B runs it to done."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    env = fleet_env(redis, model_id)
    with model_server(CONF, env=env, args=("--grace", "0")) as a:
        job = submit(a, 3000)
        wait_until(lambda: ran(a) == 1, 30, "A to run the job")
        a.process.send_signal(signal.SIGTERM)
        assert a.process.wait(30) in (0, -signal.SIGTERM)
    key = f"mortred:{{{model_id}}}:job:{job}"
    assert redis.command("HGET", key, "state") == "pending"
    with model_server(CONF, env=env) as b:
        assert wait(b, job)["state"] == "done"
        assert redis.command("HGET", key, "attempt") == "1"


def test_jobs_survive_a_redis_restart_and_submits_are_refused_meanwhile(
    redis: RedisServer,
) -> None:
    """Restart redis-server (AOF): accepted jobs survive and finish; while it is down,
    submits answer 503 'job store unavailable' and leave nothing behind."""
    model_id = "rep-" + uuid.uuid4().hex[:6]
    env = fleet_env(redis, model_id)
    with model_server(CONF, env=env) as a:
        jobs = [submit(a, 1500) for _ in range(4)]  # 2 running, 2 pending
        wait_until(lambda: ran(a) == 2, 30, "A to run two jobs")
        redis.stop()
        status, doc = a.json(
            "POST", "/jobs", {"images": [IMG], "req_id": "x", "params": {"delay_ms": 0}}
        )
        assert status == 503 and "job store unavailable" in doc["error"]
        assert a.json("GET", f"/jobs/{jobs[0]}")[0] == 503
        redis.start()
        results: list[str] = []

        def finish_all() -> None:
            for job in jobs:
                results.append(wait(a, job)["state"])

        wait_until(lambda: a.json("GET", f"/jobs/{jobs[0]}")[0] == 200, 30,
                   "A to reconnect to Redis")  # fmt: skip
        waiter = threading.Thread(target=finish_all)
        waiter.start()
        waiter.join(60)
        assert results == ["done"] * 4
        keys = redis.command("KEYS", f"mortred:{{{model_id}}}:job:*").split()
        assert sorted(k.rsplit(":", 1)[1] for k in keys) == sorted(jobs)
        assert redis.command("GET", f"mortred:{{{model_id}}}:depth") == "0"
