"""Is a process id a live process? One answer for the supervisor's leftovers and
trust gate and the result-file sweep. Pure: no reactor."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody reaped yet is
    dead for every caller here). Another user's process counts as alive. Without
    ``/proc`` (not Linux) the zombie case cannot be told and the answer is the
    kernel's ``kill(pid, 0)``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # gone since the kill, or no /proc
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
