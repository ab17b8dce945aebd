"""Helpers of the container tests: the tools, the image, compose stacks, HTTP.

Everything here drives the real tools (podman, podman-compose) through subprocesses
with deadlines; nothing is faked. Waiting is always for a condition (a port that
answers, a state reached) within a deadline, never a fixed sleep.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_build_inputs() -> Any:
    """deploy/container/build_inputs.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "mortred_build_inputs", ROOT / "deploy" / "container" / "build_inputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_inputs = _load_build_inputs()
IN_CI = os.environ.get("CI", "").lower() == "true"
TOOLS = ("podman", "podman-compose")
#: Debian's docker-compose 1.29 (the Docker client side), run against podman's Docker API
DOCKER_COMPOSE = "docker-compose"
DNSNAME_PLUGIN = Path("/usr/lib/cni/dnsname")
HOST_SETUP = ROOT / "deploy" / "container" / "host-setup.sh"


def missing_tools() -> list[str]:
    """What the container tests need and this machine lacks."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not DNSNAME_PLUGIN.exists():
        missing.append(f"the dnsname CNI plugin ({DNSNAME_PLUGIN})")
    return missing


def require_tools() -> None:
    """Skip (fail under CI=true) when the tools are missing, naming them."""
    missing = missing_tools()
    if not missing:
        return
    message = (
        f"container tests need {', '.join(missing)}: run deploy/container/host-setup.sh "
        "(Debian, root; .ci/run does)"
    )
    if IN_CI:
        pytest.fail(message + " [CI=true: not skipped]", pytrace=False)
    pytest.skip(message)


def require(tool: str) -> None:
    """Skip (fail under CI=true) when ``tool`` is not on PATH."""
    if shutil.which(tool) is None:
        message = f"{tool} is missing: run deploy/container/host-setup.sh"
        if IN_CI:
            pytest.fail(message + " [CI=true: not skipped]", pytrace=False)
        pytest.skip(message)


def run(
    argv: Sequence[str],
    *,
    timeout: float = 120,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure (check) the assertion shows its output."""
    done = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        input=input,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
        )
    return done


def build_image() -> str:
    """The image of the current build inputs: reused when one exists (by the hash of
    the inputs, deploy/container/build_inputs.py), else built (minutes, cold)."""
    env = {**os.environ, "MORTRED_SKIP_IF_BUILT": "1"}
    if not _registry_base_present():
        env["MORTRED_LOCAL_BASE"] = "1"  # no registry here: the Debian base, no pull attempt
    done = run([str(ROOT / "deploy/container/build-image.sh")], timeout=1800, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("image: ")]
    assert lines, done.stdout
    return lines[-1].removeprefix("image: ").strip()


def _registry_base_present() -> bool:
    if os.environ.get("MORTRED_LOCAL_BASE") == "1":
        return False
    probe = subprocess.run(
        ["podman", "image", "exists", "docker.io/library/python:3.11-slim"], capture_output=True
    )
    return probe.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, condition: Callable[[], Any], deadline_s: float = 120.0) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            found = condition()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc  # not yet (refused, reset, not JSON yet): keep polling
        else:
            if found:
                return found
            last = found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {deadline_s} s waiting for {what} (last: {last!r})")


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
    timeout: float = 60.0,
) -> Answer:
    """One HTTP request; any status is an :class:`Answer` (never an exception)."""
    headers = {}
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return Answer(answer.status, dict(answer.headers), answer.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, dict(exc.headers), exc.read())


def answers(url: str) -> bool:
    try:
        return http("GET", url, timeout=2.0).status == 200
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class Stack:
    """A podman-compose project of this repository's compose files, torn down
    (containers and volumes) by :meth:`down`."""

    files: tuple[str, ...]
    env: dict[str, str]
    project: str = field(default_factory=lambda: f"mortredtest{uuid.uuid4().hex[:8]}")
    #: the compose implementation: podman-compose, or docker-compose (Debian's 1.29)
    #: talking to podman's Docker API (``DOCKER_HOST`` in ``env``)
    tool: str = "podman-compose"

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.tool, "-p", self.project]
        for f in self.files:
            argv += ["-f", f]
        return run([*argv, *args], timeout=timeout, env={**os.environ, **self.env}, check=check)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def up(self) -> None:
        self.compose("up", "-d")

    def stop(self, timeout_s: int = 45) -> None:
        self.compose("stop", "-t", str(timeout_s), timeout=timeout_s * 4 + 60)

    def start(self) -> None:
        self.compose("start")

    def logs(self, service: str) -> str:
        done = run(["podman", "logs", self.container(service)], check=False)
        return done.stdout + done.stderr

    def inspect(self, service: str) -> dict[str, Any]:
        done = run(["podman", "inspect", self.container(service)])
        return json.loads(done.stdout)[0]

    def exec(self, service: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return run(["podman", "exec", self.container(service), *argv], check=False)

    def down(self) -> None:
        # containers first (their volumes are in use until then), then this project's volumes
        self.compose("down", "-t", "30", timeout=600, check=False)
        volumes = run(
            [
                "podman",
                "volume",
                "ls",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
            ],
            check=False,
        ).stdout.split()
        if volumes:
            run(["podman", "volume", "rm", "-f", *volumes], check=False)
        run(["podman", "network", "rm", "-f", f"{self.project}_default"], check=False)
