"""The customer guide's T1–T16 (tests/control/test_customer_guide.py, the same test
functions) against docker-compose.yml under podman-compose: the control plane in its
container, reached only through the ports compose publishes on 127.0.0.1.

The guide's own SIGTERM test starts a host process, not this stack; the container's
stop is tested in test_image.py and test_compose_redis.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.support import Stack, answers, free_port, http, wait_for
from tests.control.plane import API_TOKEN, GW_TOKEN, ControlPlane
from tests.control.test_customer_guide import (  # noqa: F401 (collected and used here)
    MODEL,
    SYNC_MODEL,
    jobs,
    run_time,
    test_gateway_metrics,
    test_prerequisites,
    test_t01_blocking_infer_baseline,
    test_t02_submit_is_202_at_once,
    test_t03_not_done_right_after_submit,
    test_t04_poll_until_terminal,
    test_t05_result_repeatable,
    test_t06_wait_until_terminal,
    test_t07_wait_budget_expiry,
    test_t08_two_waiters,
    test_t09_serial_submits_hit_429,
    test_t10_auth,
    test_t11_unknown_job,
    test_t12_async_disabled_is_404,
    test_t13_wrong_method_is_405,
    test_t14_restart_drops_jobs,
    test_t15_bare_jobs_not_routed,
    test_t16_malformed_envelope_is_422_before_admission,
)


class _InContainer:
    """Stands for the supervisor process of a host plane: the container runs it."""

    def poll(self) -> None:
        return None


def _published_plane(gw_port: int, api_port: int) -> ControlPlane:
    """A :class:`ControlPlane` whose calls go to the published ports (its process is
    the container's, so nothing here reads a host process)."""
    plane = object.__new__(ControlPlane)
    plane.process = _InContainer()  # type: ignore[assignment]
    plane.gw_port, plane.api_port = gw_port, api_port
    plane.model_ports = {}
    plane.log_dir = Path("/nonexistent")
    plane.output = []
    return plane


@pytest.fixture(scope="module")
def plane(image: str) -> Iterator[ControlPlane]:
    gw_port, api_port = free_port(), free_port()
    stack = Stack(
        files=("docker-compose.yml",),
        env={
            "MORTRED_IMAGE": image,
            "MORTRED_GATEWAY_PORT": str(gw_port),
            "MORTRED_SUPERVISOR_PORT": str(api_port),
            "MORTRED_GATEWAY_AUTH_TOKEN": GW_TOKEN,
            "MORTRED_API_TOKEN": API_TOKEN,
            "MORTRED_AUTOSTART": f"{MODEL},{SYNC_MODEL}",
        },
    )
    try:
        stack.up()
        wait_for("the published gateway", lambda: answers(f"http://127.0.0.1:{gw_port}/healthz"))
        plane = _published_plane(gw_port, api_port)
        assert http("GET", f"http://127.0.0.1:{api_port}/api/v1/status").status == 401
        plane.wait_ready(["gateway", MODEL, SYNC_MODEL], timeout=180)
        yield plane
    finally:
        stack.down()
