"""pid_alive: a live process is alive; an exited one, reaped or a zombie, is not."""

from __future__ import annotations

import os
import subprocess
import sys

from mortred_twisted.pids import pid_alive
from tests.support.waiting import wait_until


def test_this_process_is_alive() -> None:
    assert pid_alive(os.getpid())


def test_an_exited_child_is_dead_before_and_after_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # not waited for: a zombie until reaped (its stat says Z)
    wait_until(lambda: not pid_alive(child.pid), 30, "the zombie counted dead")
    child.wait()
    assert not pid_alive(child.pid)


def test_a_running_child_is_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
