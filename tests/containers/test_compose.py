"""docker-compose.yml under podman-compose: the control plane in one container, the
README's first example and the customer flow through the published gateway."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator

import pytest

from tests.containers.support import Stack, answers, free_port, http, require, run, wait_for

GW_TOKEN = "gw-compose-test-token"
API_TOKEN = "api-compose-test-token"
MODELS = ("DDPM", "FAKE_ASYNC", "FAKE_SYNC", "SHARPEN")


class ControlPlane:
    def __init__(self, stack: Stack, gateway: str, supervisor: str) -> None:
        self.stack = stack
        self.gateway = gateway
        self.supervisor = supervisor


@pytest.fixture(scope="module", params=["podman-compose", "docker-compose"])
def plane(request: pytest.FixtureRequest, image: str) -> Iterator[ControlPlane]:
    """The stack under podman-compose, then under Debian's docker-compose (1.29, the
    Docker client) talking to podman's Docker API."""
    tool = request.param
    extra: dict[str, str] = {}
    if tool == "docker-compose":
        require(tool)
        extra["DOCKER_HOST"] = request.getfixturevalue("docker_host")
    gw_port, sup_port = free_port(), free_port()
    stack = Stack(
        tool=tool,
        files=("docker-compose.yml",),
        env={
            **extra,
            "MORTRED_IMAGE": image,
            "MORTRED_GATEWAY_PORT": str(gw_port),
            "MORTRED_SUPERVISOR_PORT": str(sup_port),
            "MORTRED_GATEWAY_AUTH_TOKEN": GW_TOKEN,
            "MORTRED_API_TOKEN": API_TOKEN,
            "MORTRED_AUTOSTART": ",".join(MODELS),
        },
    )
    try:
        stack.up()
        plane = ControlPlane(stack, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{sup_port}")
        wait_for("the published gateway", lambda: answers(f"{plane.gateway}/healthz"))

        def models_ready() -> bool:
            status = http("GET", f"{plane.supervisor}/api/v1/status", token=API_TOKEN).json()
            ready = {s["id"] for s in status["servers"] if s["ready"]}
            return set(MODELS) <= ready

        wait_for("the autostarted models", models_ready, deadline_s=300)
        yield plane
    finally:
        stack.down()


def test_readme_first_example(plane: ControlPlane) -> None:
    """README § Quick start, the curl example, through the published gateway."""
    image = base64.b64encode(b"ignored by generative models").decode()
    submitted = http(
        "POST",
        f"{plane.gateway}/v1/models/DDPM/jobs",
        token=GW_TOKEN,
        body={"images": [image], "params": {"seed": 7}},
    )
    assert submitted.status == 202, submitted.body
    job = submitted.json()
    assert submitted.headers["Location"] == job["poll_url"]
    waited = http(
        "GET", f"{plane.gateway}{job['poll_url']}/wait?timeout=120000", token=GW_TOKEN, timeout=180
    )
    assert waited.json()["state"] == "done", waited.body
    result = http("GET", f"{plane.gateway}{job['result_url']}", token=GW_TOKEN).json()
    assert base64.b64decode(result["data"]["images"][0])[:4] == b"\x89PNG"


def test_customer_flow(plane: ControlPlane) -> None:
    jobs = f"{plane.gateway}/v1/models/SHARPEN/jobs"
    picture = _png()
    body = {"params": {"image": base64.b64encode(picture).decode(), "amount": 2}}
    # 401 without a token, and with a wrong one
    assert http("POST", jobs, body=body).status == 401
    assert http("POST", jobs, token="wrong", body=body).status == 401
    # 422: a body the model refuses (amount is 0..4), nothing admitted
    refused = http("POST", jobs, token=GW_TOKEN, body={"params": {**body["params"], "amount": 99}})
    assert refused.status == 422, refused.body
    # 404: a model whose async API is off
    off = http("POST", f"{plane.gateway}/v1/models/FAKE_SYNC/jobs", token=GW_TOKEN, body={})
    assert off.status == 404, off.body
    # 202, wait, result, and its result file through the gateway
    submitted = http("POST", jobs, token=GW_TOKEN, body=body)
    assert submitted.status == 202, submitted.body
    job = submitted.json()
    waited = http("GET", f"{plane.gateway}{job['poll_url']}/wait?timeout=60000", token=GW_TOKEN)
    assert waited.json()["state"] == "done", waited.body
    result = http("GET", f"{plane.gateway}{job['result_url']}", token=GW_TOKEN)
    assert result.status == 200
    output = result.json()["data"]
    assert output["url"].startswith(f"/v1/models/SHARPEN/jobs/{job['job_id']}/files/")
    assert http("GET", plane.gateway + output["url"]).status == 401
    fetched = http("GET", plane.gateway + output["url"], token=GW_TOKEN)
    assert fetched.status == 200 and fetched.body[:4] == b"\x89PNG"
    assert hashlib.sha256(fetched.body).hexdigest() == output["sha256"]


def test_non_root_read_only_root_and_logs_on_the_volume(plane: ControlPlane) -> None:
    info = plane.stack.inspect("mortred")
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    assert plane.stack.exec("mortred", "id", "-u").stdout.strip() == "10001"
    logs = plane.stack.exec("mortred", "ls", "/var/lib/mortred/logs").stdout.split()
    assert {"gateway.log", "DDPM.log", "SHARPEN.log"} <= set(logs)
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/var/lib/mortred"]["Type"] == "volume"


def test_health_state(plane: ControlPlane) -> None:
    name = plane.stack.container("mortred")
    assert run(["podman", "healthcheck", "run", name], check=False).returncode == 0
    assert plane.stack.inspect("mortred")["State"]["Health"]["Status"] == "healthy"
    # the supervisor's API and the web UI are published too (behind their token)
    assert http("GET", f"{plane.supervisor}/api/v1/status").status == 401
    assert http("GET", f"{plane.supervisor}/api/v1/status", token=API_TOKEN).status == 200


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (30, 200, 30)).save(buffer, "PNG")
    return buffer.getvalue()
