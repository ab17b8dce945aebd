"""The cost of a pick per job on the memory store's ledger (issue 19 item 7).

    .venv/bin/python bench/fair_pick.py [--jobs 20000] [--repeat 5]

One job's whole life in the ledger, in one thread, no reactor: admit, choose the
next job (``next_pending``: the fair order; a ledger without it, i.e. a checkout
before issue 19, starts its oldest job as the runner's FIFO did), start it, finish
it. Backlogs of 100 and 10,000 pending jobs, from 1 and 16 callers (round robin),
all one band, and a mix of bands. Prints µs per job (median of ``--repeat`` runs).
Run it in a ``git worktree`` of the base commit with the same interpreter for the
A/B (it puts its own checkout first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mortred_twisted.jobs.ledger import AsyncJobTable  # noqa: E402


def one_run(backlog: int, callers: int, jobs: int, bands: bool) -> float:
    """µs per job for ``jobs`` jobs cycled through a ledger holding ``backlog``."""
    fair = hasattr(AsyncJobTable, "next_pending")
    table: AsyncJobTable[str] = AsyncJobTable(
        max_queue=backlog + 10, max_completed=100, job_ttl_ms=0
    )
    names = [f"key:c{i}" for i in range(callers)]
    priorities = ("low", "normal", "high")
    order: list[str] = []

    def admit(i: int) -> None:
        kwargs: dict[str, object] = {"owner": names[i % callers]}
        if fair and bands:
            kwargs["priority"] = priorities[i % 3]
        job_id = table.admit("r", **kwargs).job_id  # type: ignore[arg-type]
        assert job_id is not None
        order.append(job_id)

    for i in range(backlog):
        admit(i)
    head = 0
    started = time.perf_counter()
    for i in range(jobs):
        admit(backlog + i)
        if fair:
            job_id = table.next_pending()
        else:  # FIFO: the oldest pending job
            job_id = order[head]
            head += 1
        assert job_id is not None
        table.transition_running(job_id)
        table.finish(job_id, b"{}")
    return (time.perf_counter() - started) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    fair = hasattr(AsyncJobTable, "next_pending")
    print(f"checkout: {ROOT} ({'fair order' if fair else 'FIFO (before issue 19)'})")
    print("| backlog | callers | bands | µs per job (admit + pick + start + finish) |")
    print("|---|---|---|---|")
    for backlog, callers, bands in (
        (100, 1, False), (100, 16, False), (10_000, 1, False), (10_000, 16, False),
        (10_000, 16, True),
    ):  # fmt: skip
        runs = [one_run(backlog, callers, args.jobs, bands) for _ in range(args.repeat)]
        print(f"| {backlog} | {callers} | {'3' if bands else '1'} | "
              f"{statistics.median(runs):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
