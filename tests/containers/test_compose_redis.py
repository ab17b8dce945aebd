"""docker-compose.redis.yml under podman-compose: Redis with its AOF on a volume, two
replica containers of one model id reached by service name, the gateway alone in front,
tokens from files; stopping the stack with jobs running and pending, then starting it
again, loses none of them."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from tests.containers.support import ROOT, Stack, answers, free_port, http, run, wait_for

MODEL = "FAKE_REPLICAS"
JOB_MS = 5000


@pytest.fixture(scope="module")
def stack(image: str, redis_image: str) -> Iterator[tuple[Stack, str, str]]:
    run([str(ROOT / "deploy/container/make-secrets.sh")])
    token = (ROOT / "var/secrets/gateway_token").read_text().strip()
    port = free_port()
    stack = Stack(
        files=("docker-compose.redis.yml",),
        env={
            "MORTRED_IMAGE": image,
            "MORTRED_REDIS_IMAGE": redis_image,
            "MORTRED_GATEWAY_PORT": str(port),
            # a 1 s grace: the stop hands the running jobs back to the queue (the
            # shipped 30 s would let them finish)
            "MORTRED_REPLICA_GRACE_S": "1",
        },
    )
    try:
        stack.up()
        base = f"http://127.0.0.1:{port}"
        wait_for("the published gateway", lambda: answers(f"{base}/healthz"))
        yield stack, base, token
    finally:
        stack.down()


def _state(base: str, token: str, job: str) -> str:
    return http("GET", f"{base}/v1/models/{MODEL}/jobs/{job}", token=token).json()["state"]


def _submit_when_ready(base: str, token: str) -> str:
    """A submit once a replica answers (the gateway may be up before the replicas)."""

    def submit() -> str | None:
        answer = http(
            "POST",
            f"{base}/v1/models/{MODEL}/jobs",
            token=token,
            body={"images": [base64.b64encode(b"x").decode()], "params": {"delay_ms": JOB_MS}},
        )
        return answer.json()["job_id"] if answer.status == 202 else None

    return wait_for("a replica to admit a job", submit, deadline_s=180)


def test_stop_and_start_loses_no_admitted_job(stack: tuple[Stack, str, str]) -> None:
    compose, base, token = stack
    assert http("POST", f"{base}/v1/models/{MODEL}/jobs", body={}).status == 401
    jobs = [_submit_when_ready(base, token) for _ in range(3)]
    # each replica has one worker: two jobs running at once means both replica
    # containers took one (reached by service name); the third waits in Redis
    wait_for(
        "two jobs running on the two replicas",
        lambda: sorted(_state(base, token, j) for j in jobs) == ["pending", "running", "running"],
    )
    compose.stop(timeout_s=45)
    for service in ("gateway", "replica-1", "replica-2", "redis"):
        state = compose.inspect(service)["State"]
        assert state["Status"] == "exited", (service, state)
    for replica in ("replica-1", "replica-2"):
        log = compose.logs(replica)
        assert "Received SIGTERM" in log and "Server Shut Down" in log, log[-2000:]
    # AOF on the volume
    assert "appendonly" in run(
        ["podman", "run", "--rm", "-v", f"{compose.project}_redis-data:/data:ro",
         "--entrypoint", "/bin/ls", compose.inspect("redis")["ImageName"], "/data"]
    ).stdout  # fmt: skip
    compose.start()
    wait_for("the published gateway", lambda: answers(f"{base}/healthz"))
    for job in jobs:
        waited = wait_for(
            f"{job} to end",
            lambda job=job: (
                (a := http("GET", f"{base}/v1/models/{MODEL}/jobs/{job}/wait?timeout=20000",
                           token=token, timeout=30)).status == 200
                and a.json()["state"] in ("done", "failed", "cancelled")
                and a
            ),
            deadline_s=180,
        )  # fmt: skip
        assert waited.json()["state"] == "done", waited.body
        result = http("GET", f"{base}/v1/models/{MODEL}/jobs/{job}/result", token=token)
        assert result.status == 200 and result.json()["code"] == 0, result.body


def test_healthy_replicas_and_gateway(stack: tuple[Stack, str, str]) -> None:
    compose, _, _ = stack
    for service in ("gateway", "replica-1", "replica-2"):
        name = compose.container(service)
        assert run(["podman", "healthcheck", "run", name], check=False).returncode == 0, service
        assert compose.exec(service, "id", "-u").stdout.strip() == "10001"
        assert compose.inspect(service)["HostConfig"]["ReadonlyRootfs"] is True
