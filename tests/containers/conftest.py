"""Container tests (issue 34): the image and the compose files, really built and run
with podman here. Marked ``containers`` and ``slow``; they skip with the reason when
podman, podman-compose or the dnsname plugin are missing, and fail instead under
``CI=true`` (.ci/run installs them: deploy/container/host-setup.sh).

Cost: the image is reused while its build inputs are unchanged (the hash of
deploy/container/build_inputs.py); a source change rebuilds the last layers, a cold
build (no layer cache) takes minutes (docs/operations.md § Containers has the figures).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.support import build_image, require_tools, run, wait_for


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containers: builds and runs the container image")


#: modules of this folder that need no container tool (fast, not marked)
_PURE = ("test_build_inputs.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.fspath).replace("\\", "/")
        if "tests/containers/" in path and not path.endswith(_PURE):
            item.add_marker(pytest.mark.containers)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this checkout (built once per session when its inputs changed)."""
    require_tools()
    return build_image()


@pytest.fixture(scope="session")
def redis_image() -> str:
    """A Redis >= 7 image: the official one when present, else one from Debian's
    packages (deploy/container/build-redis-image.sh)."""
    require_tools()
    official = "docker.io/library/redis:7.2"
    if subprocess.run(["podman", "image", "exists", official]).returncode == 0:
        return official
    run(["deploy/container/build-redis-image.sh"], timeout=900)
    return "localhost/mortred-redis:bookworm"


@pytest.fixture
def container_names() -> Iterator[list[str]]:
    """Names of containers a test starts with ``podman run``; removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        run(["podman", "rm", "-f", "-v", "-t", "5", name], check=False, timeout=120)


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """``DOCKER_HOST`` of podman's Docker-compatible API (``podman system service``), for
    Docker's own clients (docker-compose); the service is stopped afterwards."""
    require_tools()
    folder = Path(tempfile.mkdtemp(prefix="mortred-podman-api-"))
    socket_path = folder / "podman.sock"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("podman's API socket", lambda: socket_path.exists(), deadline_s=60)
        yield f"unix://{socket_path}"
    finally:
        service.terminate()
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(timeout=30)
        socket_path.unlink(missing_ok=True)
        os.rmdir(folder)
