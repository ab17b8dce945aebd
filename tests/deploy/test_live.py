"""The manifests' pods as real processes on 127.0.0.1: probes, tokens, a job, KEDA's metric.

Each mortred pod of deploy/kubernetes/ runs here the way its container would: the
image's entry point (deploy/container/entrypoint.sh) with the manifest's ``args`` and
``env``, its working directory a copy of the image's layout (conf/ of this checkout
plus the ConfigMap's files under conf/kubernetes/), its secrets as files (the Secret
volume's paths moved to a temporary folder), and a real ``redis-server`` for the
Redis store. Only what a pod cannot have here is changed, each named below: listen
addresses and ports (loopback, free ports; the manifests' ports are checked against
the configs in test_agreement.py), the Service name in the gateway's upstream (the
model's loopback address), the exporter's log folder (the data volume's path) and the
server file's own port (so that the catalog's port is the model's, and nothing else on
this machine at 18120 can answer).

Then: every probe of every pod answers 200 on its path; the gateway takes a job with
the token from its file and the model runs it through Redis; the model refuses a
request without the internal token; the exporter serves the metric the KEDA
ScaledObject queries, for the id, behind the API token.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import (
    ROOT,
    containers,
    env_of,
    find,
    mortred_workloads,
    port_number,
    role,
    secret_file_paths,
)
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port, plugin_path, stop_process
from tests.support.waiting import wait_until

ENTRYPOINT = ROOT / "deploy" / "container" / "entrypoint.sh"
KUBE_CONFIG = ROOT / "deploy" / "kubernetes" / "config"
DATA_VOLUME = "/var/lib/mortred"
SECRETS = {"gateway_token": "gw-" + "g" * 30, "internal_token": "in-" + "i" * 30}
SECRETS["api_token"] = "api-" + "a" * 30


def workload(role_name: str) -> dict[str, Any]:
    (hit,) = [w for w in mortred_workloads() if role(w) == role_name]
    return hit


def get(
    port: int, path: str, token: str | None = None, method: str = "GET", body: Any = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


class Pod:
    """One pod's process: the entry point with the manifest's args and env."""

    def __init__(self, name: str, process: subprocess.Popen[str], port: int) -> None:
        self.name = name
        self.process = process
        self.port = port

    def output(self) -> str:
        stop_process(self.process, 30)
        assert self.process.stdout is not None
        return self.process.stdout.read()[-4000:]


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """/opt/mortred as the image has it: this checkout's conf/ (links), and the
    ConfigMap's files under conf/kubernetes/."""
    root = tmp_path / "opt-mortred"
    conf = root / "conf"
    conf.mkdir(parents=True)
    for entry in (ROOT / "conf").iterdir():
        if entry.name != "replicas":
            (conf / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "conf" / "replicas", conf / "replicas")
    (conf / "kubernetes").mkdir()
    return root


@contextmanager
def run_pod(
    workload_doc: dict[str, Any],
    root: Path,
    secrets_dir: Path,
    port: int,
    extra_args: list[str],
    extra_env: dict[str, str],
) -> Iterator[Pod]:
    (container,) = containers(workload_doc)
    env = env_of(container)
    for path in secret_file_paths(workload_doc):  # the Secret volume's files, moved
        for name, value in env.items():
            if value == path:
                env[name] = str(secrets_dir / Path(path).name)
    plugins = plugin_path()
    child_env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), plugins]),
        "PYTHONUNBUFFERED": "1",
        "HOME": str(root.parent),
        **env,
        **extra_env,
    }
    process = subprocess.Popen(
        ["sh", str(ENTRYPOINT), *container["args"], *extra_args],
        cwd=str(root),
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield Pod(workload_doc["metadata"]["name"], process, port)
    finally:
        stop_process(process, 30)
        shutil.rmtree(plugins, ignore_errors=True)


def probes(pod: Pod, workload_doc: dict[str, Any]) -> list[tuple[str, str]]:
    (container,) = containers(workload_doc)
    found = []
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in container:
            http_get = container[kind]["httpGet"]
            # the probe's port is the container's port, which the pod listens on here
            assert (
                port_number(container, http_get["port"]) == container["ports"][0]["containerPort"]
            )
            found.append((kind, http_get["path"]))
    return found


def test_the_pods_run_as_the_manifests_say(image_root: Path, tmp_path: Path) -> None:
    model_doc, gateway_doc, exporter_doc = (
        workload("model"),
        workload("gateway"),
        workload("supervisor"),
    )
    model_port, gateway_port, exporter_port = free_port(), free_port(), free_port()
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    conf = image_root / "conf"

    # the server file's own port -> the model's port here (see the module docstring)
    model_args = containers(model_doc)[0]["args"]
    server_file = conf / model_args[model_args.index("--config") + 1].removeprefix("conf/")
    text = server_file.read_text()
    manifest_port = env_of(containers(model_doc)[0])["MORTRED_LISTEN_PORT"]
    assert f"port = {manifest_port}\n" in text
    server_file.write_text(text.replace(f"port = {manifest_port}\n", f"port = {model_port}\n"))

    service = find("Service", model_doc["metadata"]["name"])
    upstream = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    gateway_toml = (KUBE_CONFIG / "gateway.toml").read_text()
    assert upstream in gateway_toml
    (conf / "kubernetes" / "gateway.toml").write_text(
        gateway_toml.replace(upstream, f"http://127.0.0.1:{model_port}")
    )
    exporter_toml = (KUBE_CONFIG / "exporter.toml").read_text()
    assert f'"{DATA_VOLUME}/logs"' in exporter_toml
    (conf / "kubernetes" / "exporter.toml").write_text(
        exporter_toml.replace(f'"{DATA_VOLUME}/logs"', json.dumps(str(data / "logs")))
    )

    with ExitStack() as stack:
        redis: RedisServer = stack.enter_context(redis_server())
        secrets_dir = tmp_path / "secrets"
        secrets_dir.mkdir()
        for name, value in {**SECRETS, "redis_url": redis.url}.items():
            (secrets_dir / name).write_text(value + "\n")
            (secrets_dir / name).chmod(0o440)
        loopback = {"MORTRED_LISTEN_HOST": "127.0.0.1", "MORTRED_LISTEN_PORT": str(model_port)}
        model = stack.enter_context(
            run_pod(model_doc, image_root, secrets_dir, model_port, [], loopback)
        )
        gateway = stack.enter_context(
            run_pod(
                gateway_doc,
                image_root,
                secrets_dir,
                gateway_port,
                ["--host", "127.0.0.1", "--port", str(gateway_port)],
                {},
            )
        )
        exporter = stack.enter_context(
            run_pod(
                exporter_doc,
                image_root,
                secrets_dir,
                exporter_port,
                ["--api-host", "127.0.0.1", "--api-port", str(exporter_port)],
                {},
            )
        )
        pods = [(model, model_doc), (gateway, gateway_doc), (exporter, exporter_doc)]

        # every probe of every pod: 200 on its path (the readiness ones once ready)
        for pod, doc in pods:
            for kind, path in probes(pod, doc):
                # 503 while not ready; a 404 (no such route) or an ended process is final
                try:
                    wait_until(
                        lambda p=pod, q=path: get(p.port, q)[0] in (200, 404) or p.process.poll(),
                        90,
                        f"{pod.name} {kind} {path}",
                    )
                except AssertionError:
                    raise AssertionError(f"{pod.name} {kind} {path}:\n{pod.output()}") from None
                status = get(pod.port, path)[0]
                assert status == 200, f"{pod.name} {kind} {path}: {status}\n{pod.output()}"

        # the gateway's token and the internal token came from their files
        image = base64.b64encode(b"deploy test").decode()
        job = {"images": [image], "params": {"delay_ms": 5}}
        jobs = "/v1/models/FAKE_REPLICAS/jobs"
        assert get(gateway.port, jobs, None, "POST", job)[0] == 401
        assert get(model.port, "/jobs", None, "POST", job)[0] == 401
        status, body = get(gateway.port, jobs, SECRETS["gateway_token"], "POST", job)
        assert status == 202, body
        job_id = json.loads(body)["job_id"]
        status, body = get(
            gateway.port, f"{jobs}/{job_id}/wait?timeout=60000", SECRETS["gateway_token"]
        )
        assert status == 200 and json.loads(body)["state"] == "done", body

        # the exporter serves the metric KEDA queries, behind the API token
        trigger = find("ScaledObject", model_doc["metadata"]["name"])["spec"]["triggers"][0]
        query = trigger["metadata"]["query"]
        series = re.fullmatch(r"max\((\w+\{[^}]*\})\)", query)
        assert series is not None, query
        assert get(exporter.port, "/api/v1/metrics")[0] == 401

        def gauge() -> str | None:
            status, text = get(exporter.port, "/api/v1/metrics", SECRETS["api_token"])
            assert status == 200
            for line in text.decode().splitlines():
                if line.startswith(series.group(1) + " "):
                    return line
            return None

        line = wait_until(gauge, 60, f"{series.group(1)} on the exporter")
        assert float(line.split()[-1]) >= 0
        # the exporter started no model: it only measures
        status, text = get(exporter.port, "/api/v1/metrics", SECRETS["api_token"])
        assert 'mortred_supervisor_ready{server="FAKE_REPLICAS"} 0.0' in text.decode()
        for pod, _doc in pods:
            assert pod.process.poll() is None, f"{pod.name} ended:\n{pod.output()}"
