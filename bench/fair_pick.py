"""The cost of a pick per job on the memory store's ledger (issue 19 item 7).

    .venv/bin/python bench/fair_pick.py [--jobs 20000] [--repeat 5]
    .venv/bin/python bench/fair_pick.py --redis [--jobs 2000] [--repeat 3]

One job's whole life in the ledger, in one thread, no reactor: admit, choose the
next job (``next_pending``: the fair order; a ledger without it, i.e. a checkout
before issue 19, starts its oldest job as the runner's FIFO did), start it, finish
it. Backlogs of 100 and 10,000 pending jobs, from 1 and 16 callers (round robin),
all one band, and a mix of bands. Prints µs per job (median of ``--repeat`` runs).
Run it in a ``git worktree`` of the base commit with the same interpreter for the
A/B (it puts its own checkout first on ``sys.path``).

``--redis``: the same cycle on the Redis store against a local ``redis-server``
started for the run (ADMIT, CLAIM, TERMINATE: three round trips, one after another,
on the reactor): µs per job of wall time, and of Redis CPU in the three scripts
(``INFO commandstats``: the cost of the pick itself, which the round trips hide);
before issue 19 CLAIM read a stream (FIFO).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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


def redis_runs(jobs: int, repeat: int) -> None:
    """The ``--redis`` table (module docstring)."""
    import uuid

    from twisted.internet import defer, reactor

    from mortred_twisted.jobs.states import JobState
    from mortred_twisted.models.base import InferenceRequest
    from tests.stores.test_store_contract import redis_store
    from tests.support.redis_server import redis_server

    request = InferenceRequest(req_id="r", images=(b"x",))
    rows: list[str] = []

    def script_us(redis: Any) -> float:
        """Redis CPU spent in scripts since the last reset (INFO commandstats)."""
        text = redis.command("INFO", "commandstats")
        match = re.search(r"cmdstat_evalsha:calls=\d+,usec=(\d+)", text)
        return float(match.group(1)) if match else 0.0

    async def one(redis: Any, backlog: int, callers: int) -> tuple[float, float]:
        url = redis.url
        store = redis_store(url, "B" + uuid.uuid4().hex[:8], max_queue=backlog + jobs + 10)
        store.start()
        await store.link.when_connected()
        names = [f"key:c{i}" for i in range(callers)]
        await defer.gatherResults(
            [store.admit(request, owner=names[i % callers]) for i in range(backlog)]
        )
        redis.command("CONFIG", "RESETSTAT")
        started = time.perf_counter()
        for i in range(jobs):
            await store.admit(request, owner=names[i % callers])
            claim = await store.claim_next()
            await store.terminate(claim.job_id, JobState.DONE, result=b"{}")
        spent = (time.perf_counter() - started) / jobs * 1e6
        in_redis = script_us(redis) / jobs
        await store.stop()
        return spent, in_redis

    async def all_rows(redis: Any) -> None:
        for backlog, callers in ((100, 1), (100, 16), (10_000, 1), (10_000, 16)):
            runs = [await one(redis, backlog, callers) for _ in range(repeat)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            rows.append(f"| {backlog} | {callers} | {wall:.0f} | {cpu:.1f} |")

    with redis_server() as redis:
        done = defer.Deferred.fromCoroutine(all_rows(redis))
        done.addErrback(lambda f: print(f.getTraceback()))
        done.addBoth(lambda _: reactor.stop())
        reactor.run()
    print("| backlog | callers | µs per job, wall (3 round trips) | µs per job in Redis scripts |")
    print("|---|---|---|---|")
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--redis", action="store_true", help="the Redis store instead")
    args = parser.parse_args()
    if args.redis:
        redis_runs(args.jobs, args.repeat)
        return
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
