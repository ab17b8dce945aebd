"""torch's intra-op thread count for a model server (torch imported only if in use).

Policy: ``torch_threads`` from the server config, or, when 0, the machine's CPUs
divided among the workers (at least 1). Without it every worker's ops would each
start one thread per CPU and the workers would oversubscribe the cores (measured by
the perception tests: ~10x slower on a shared 2-CPU machine). The setting is
process-wide; it is applied after the model instances are built, and only when a
model family has actually imported torch (the fake model never does).
"""

from __future__ import annotations

import os
import sys


def torch_threads_for(configured: int, worker_nums: int) -> int:
    """The intra-op thread count to use (``configured`` wins when > 0)."""
    if configured > 0:
        return configured
    return max(1, (os.cpu_count() or 1) // max(1, worker_nums))


def apply_torch_threads(threads: int) -> bool:
    """Set torch's intra-op threads if torch is loaded; True when applied."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    torch.set_num_threads(threads)
    return True
