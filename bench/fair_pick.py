"""The cost of a pick per job on both job stores (issue 19 item 7).

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
(``INFO commandstats``: the cost of the scripts, which the round trips hide), then
per script: ``--jobs`` admissions one by one, as many claims (CLAIM is the pick),
then their ends, each phase's script time over its calls. Before issue 19 CLAIM read
a stream (FIFO). The store keeps 100 finished jobs, so every TERMINATE also evicts
one (retention per caller).
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

#: The scripts of one job's cycle on Redis (``--redis``), in order.
PHASES = ("admit", "claim", "terminate")


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
    from mortred_twisted.model_api.base import InferenceRequest
    from tests.stores.test_store_contract import redis_store
    from tests.support.redis_server import redis_server

    request = InferenceRequest(req_id="r", images=(b"x",))
    rows: list[str] = []

    async def script_us(store: Any) -> float:
        """µs Redis spent in scripts since the last reset (INFO commandstats)."""
        text = (await store.link.call("INFO", "commandstats")).decode()
        match = re.search(r"cmdstat_evalsha:calls=\d+,usec=(\d+)", text)
        return float(match.group(1)) if match else 0.0

    async def phase(store: Any, calls: list[Any]) -> float:
        """µs of Redis script time per call of ``calls`` (thunks, run one by one)."""
        await store.link.call("CONFIG", "RESETSTAT")
        for call in calls:
            await call()
        return await script_us(store) / len(calls)

    async def one(redis: Any, backlog: int, callers: int) -> tuple[float, ...]:
        url = redis.url
        store = redis_store(url, "B" + uuid.uuid4().hex[:8], max_queue=backlog + 2 * jobs + 10)
        store.start()
        await store.link.when_connected()
        names = [f"key:c{i}" for i in range(callers)]
        await defer.gatherResults(
            [store.admit(request, owner=names[i % callers]) for i in range(backlog)]
        )
        await store.link.call("CONFIG", "RESETSTAT")
        started = time.perf_counter()
        for i in range(jobs):
            await store.admit(request, owner=names[i % callers])
            claim = await store.claim_next()
            await store.terminate(claim.job_id, JobState.DONE, result=b"{}")
        spent = (time.perf_counter() - started) / jobs * 1e6
        in_redis = await script_us(store) / jobs
        # each script alone: `jobs` admissions, then as many claims, then their ends
        claimed: list[str] = []

        async def take() -> None:
            claimed.append((await store.claim_next()).job_id)

        def end(job_id: str) -> Any:
            return lambda: store.terminate(job_id, JobState.DONE, result=b"{}")

        admit = await phase(
            store, [lambda i=i: store.admit(request, owner=names[i % callers]) for i in range(jobs)]
        )
        pick = await phase(store, [take] * jobs)
        terminate = await phase(store, [end(job) for job in claimed])
        await store.stop()
        return spent, in_redis, admit, pick, terminate

    async def all_rows(redis: Any) -> None:
        for backlog, callers in ((100, 1), (100, 16), (10_000, 1), (10_000, 16)):
            runs = [await one(redis, backlog, callers) for _ in range(repeat)]
            cols = [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]
            rows.append(
                f"| {backlog} | {callers} | {cols[0]:.0f} | "
                + " | ".join(f"{c:.0f}" for c in cols[1:])
                + " |"
            )

    with redis_server() as redis:
        done = defer.Deferred.fromCoroutine(all_rows(redis))
        done.addErrback(lambda f: print(f.getTraceback()))
        done.addBoth(lambda _: reactor.stop())
        reactor.run()
    print(
        "| backlog | callers | µs per job, wall (3 round trips) | µs per job in Redis "
        "scripts | " + " | ".join(f"{name.upper()} µs per call" for name in PHASES) + " |"
    )
    print("|---|---|---|---|" + "---|" * len(PHASES))
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
