"""The supervisor as a real process: crash-restart of a child, and no orphans even
when the supervisor itself is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .plane import control_plane, pid_alive, wait_until

pytestmark = pytest.mark.slow


def test_crashed_model_is_restarted_then_orphans_die_with_a_killed_supervisor(
    tmp_path: Path,
) -> None:
    """A model killed behind the supervisor's back comes back (on-failure); after a
    SIGKILL of the supervisor the kernel's parent-death signal stops every child."""
    with control_plane(tmp_path, ["FAKE_SYNC"]) as plane:
        status = plane.wait_ready(["gateway", "FAKE_SYNC"])
        old = status["FAKE_SYNC"]["pid"]
        os.kill(old, signal.SIGKILL)
        wait_until(
            lambda: (s := plane.status().get("FAKE_SYNC", {})).get("ready") and s["pid"] != old,
            60,
            "FAKE_SYNC restarted",
        )
        st = plane.status()["FAKE_SYNC"]
        assert st["restart_count"] == 1 and st["last_exit"]["signal"] == 9
        children = plane.child_pids()
        assert len(children) == 2
        plane.process.kill()
        plane.process.wait(10)
        wait_until(lambda: not any(pid_alive(p) for p in children), 30, "children gone")
