"""tests/deploy: the Kubernetes manifests. The schema, agreement and live-process tests
are fast and need no container tool; test_pods_in_containers.py runs the image with
podman (marked ``containers`` and ``slow``, as tests/containers/ are)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containers: builds and runs the container image")
