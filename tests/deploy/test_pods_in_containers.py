"""The manifests' pods as containers of the real image, under podman, as the kubelet
would run them (as far as podman can say so).

Each mortred workload of deploy/kubernetes/ runs from the image of this checkout with
the manifest's ``args`` and ``env`` unchanged, as its pod's user (``runAsUser`` /
``runAsGroup``), with a read-only root, every capability dropped and no privilege
escalation, an ``emptyDir`` at each of the pod's emptyDir mount paths (``/tmp`` a tmpfs, the
others empty anonymous volumes), the ConfigMap's files mounted read-only where the manifest
mounts them, and the Secret's files mounted as the kubelet does (root-owned, group
``fsGroup``, ``defaultMode`` 0440). Containers share one podman network on which each
is reachable by its Service's name (a network alias), so the gateway's upstream URL
and ``redis_url`` are used as written. Redis runs with the StatefulSet's command.

Then every HTTP probe answers 200 through the published container port, the gateway
runs a job on the model replicas (two, as the Deployment says) through Redis, and the
exporter serves the series KEDA queries. Skips without podman or the dnsname plugin
(fails under CI=true), like tests/containers/.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.containers.support import build_image, free_port, http, require_tools, run
from tests.deploy.manifests import (
    KUBE,
    containers,
    env_of,
    find,
    mortred_workloads,
    mounts,
    pod_spec,
    port_number,
    role,
    workloads,
)
from tests.deploy.test_live import get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.containers, pytest.mark.slow]

TOKENS = {
    "gateway_token": "gw-" + uuid.uuid4().hex,
    "internal_token": "in-" + uuid.uuid4().hex,
    "api_token": "api-" + uuid.uuid4().hex,
    "redis_url": "redis://mortred-redis:6379/0",
}


@pytest.fixture(scope="module")
def image() -> str:
    require_tools()
    return build_image()


@pytest.fixture(scope="module")
def redis_image() -> str:
    require_tools()
    official = "docker.io/library/redis:7.2"
    if subprocess.run(["podman", "image", "exists", official]).returncode == 0:
        return official
    run(["deploy/container/build-redis-image.sh"], timeout=900)
    return "localhost/mortred-redis:bookworm"


@pytest.fixture
def network() -> Iterator[str]:
    name = "mortred-k8s-" + uuid.uuid4().hex[:8]
    run(["podman", "network", "create", name])
    try:
        yield name
    finally:
        done = run(["podman", "ps", "-a", "-q", "--filter", f"network={name}"], check=False)
        for cid in done.stdout.split():
            run(["podman", "rm", "-f", "-v", "-t", "5", cid], check=False, timeout=120)
        run(["podman", "network", "rm", "-f", name], check=False)


def kubelet_files(tmp_path: Path) -> tuple[Path, Path]:
    """The ConfigMap's and the Secret's files, as the kubelet mounts them."""
    config = tmp_path / "configmap"
    shutil.copytree(KUBE / "config", config)
    for path in config.iterdir():
        path.chmod(0o644)
    secrets = tmp_path / "secret"
    secrets.mkdir()
    for name, value in TOKENS.items():
        path = secrets / name
        path.write_text(value + "\n")
        shutil.chown(path, "root", 10001)
        path.chmod(0o440)
    return config, secrets


def podman_args(workload: dict[str, Any], config: Path, secrets: Path) -> list[str]:
    """podman run options for a workload's pod: user, security context, volumes."""
    pod = pod_spec(workload)
    (container,) = containers(workload)
    ctx = pod["securityContext"]
    sec = container["securityContext"]
    args = [f"--user={ctx['runAsUser']}:{ctx['runAsGroup']}"]
    assert sec["readOnlyRootFilesystem"] and sec["capabilities"]["drop"] == ["ALL"]
    args += ["--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"]
    for path, volume in mounts(workload).items():
        if "emptyDir" in volume and path == "/tmp":
            args.append("--tmpfs=/tmp")
        elif "emptyDir" in volume:
            # an empty anonymous volume (podman gives it the image folder's owner, as
            # fsGroup makes an emptyDir writable for the pod; a tmpfs would keep root's)
            args.append(f"--volume={path}")
        elif "configMap" in volume:
            for item in volume["configMap"]["items"]:
                args.append(f"--volume={config / item['key']}:{path}/{item['path']}:ro")
        elif "secret" in volume:
            for item in volume["secret"]["items"]:
                args.append(f"--volume={secrets / item['key']}:{path}/{item['path']}:ro")
    for name, value in env_of(container).items():
        args.append(f"--env={name}={value}")
    return args


def test_the_manifests_pods_run_in_the_image(
    image: str, redis_image: str, network: str, tmp_path: Path
) -> None:
    config, secrets = kubelet_files(tmp_path)
    suffix = uuid.uuid4().hex[:6]
    (redis,) = [w for w in workloads() if w["kind"] == "StatefulSet"]
    redis_container = containers(redis)[0]
    run(
        ["podman", "run", "-d", f"--name=redis-{suffix}", f"--network={network}",
         "--network-alias=mortred-redis", "--volume=/data",
         redis_image, *redis_container["command"]],
    )  # fmt: skip

    published: dict[str, tuple[dict[str, Any], int]] = {}
    for workload in mortred_workloads():
        name = workload["metadata"]["name"]
        (container,) = containers(workload)
        service = find("Service", name)
        copies = workload["spec"]["replicas"] if role(workload) == "model" else 1
        for n in range(copies):
            host_port = free_port()
            container_port = container["ports"][0]["containerPort"]
            run(
                ["podman", "run", "-d", f"--name={name}-{n}-{suffix}", f"--network={network}",
                 f"--network-alias={service['metadata']['name']}",
                 f"--publish=127.0.0.1:{host_port}:{container_port}",
                 *podman_args(workload, config, secrets), image, *container["args"]],
            )  # fmt: skip
            published[f"{name}-{n}"] = (workload, host_port)

    def logs(key: str) -> str:
        done = run(["podman", "logs", f"{key}-{suffix}"], check=False)
        return (done.stdout + done.stderr)[-3000:]

    for key, (workload, host_port) in published.items():
        (container,) = containers(workload)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind not in container:
                continue
            probe = container[kind]["httpGet"]
            assert port_number(container, probe["port"]) == container["ports"][0]["containerPort"]

            def probed(p: int = host_port, q: str = probe["path"]) -> int | None:
                status = get(p, q)[0]  # 0: refused (not listening yet)
                return status if status in (200, 404) else None  # 503: not ready yet

            try:
                status = wait_until(probed, 180, f"{key} {kind} {probe['path']}")
            except AssertionError as exc:
                raise AssertionError(f"{key} {kind}: {exc}\n{logs(key)}") from None
            assert status == 200, f"{key} {kind} {probe['path']}: {status}\n{logs(key)}"

    (gateway_key,) = [k for k, (w, _p) in published.items() if role(w) == "gateway"]
    gateway_port = published[gateway_key][1]
    token = TOKENS["gateway_token"]
    base = f"http://127.0.0.1:{gateway_port}/v1/models/FAKE_REPLICAS/jobs"
    job = {"images": ["aGk="], "params": {"delay_ms": 5}}
    assert http("POST", base, body=job).status == 401
    answer = http("POST", base, body=job, token=token)
    assert answer.status == 202, (answer.status, answer.body, logs(gateway_key))
    job_id = answer.json()["job_id"]
    done = http("GET", f"{base}/{job_id}/wait?timeout=60000", token=token, timeout=90)
    assert done.status == 200 and done.json()["state"] == "done", done.body

    (exporter_key,) = [k for k, (w, _p) in published.items() if role(w) == "supervisor"]
    exporter_port = published[exporter_key][1]
    model_name = next(w for w, _p in published.values() if role(w) == "model")["metadata"]["name"]
    query = find("ScaledObject", model_name)["spec"]["triggers"][0]["metadata"]["query"]
    series = query.removeprefix("max(").removesuffix(")")
    metrics_url = f"http://127.0.0.1:{exporter_port}/api/v1/metrics"
    assert http("GET", metrics_url).status == 401

    def served() -> bool:
        text = http("GET", metrics_url, token=TOKENS["api_token"]).body.decode()
        return any(line.startswith(series + " ") for line in text.splitlines())

    wait_until(served, 90, f"{series} on the exporter")
