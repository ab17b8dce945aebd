"""Threaded stress test of the production AsyncJobTable, after the seed's C++ test.

4 submitters, 2 runners, 3 pollers, 2 waiters and 2 cancellers hammer one table for
~3 s; the pollers also race the runners for each job's request payload, and the
cancellers race the runners for each job's terminal transition (a pending job
cancelled ends at once; a running one is flagged and its runner ends it cancelled).
Throughout, depth
never exceeds ``max_queue``; at the end depth is back to zero, every accepted job
terminated exactly once, every payload moved out at most once, ids are unique,
retention holds at most ``max_completed`` jobs, and no thread is left blocked.
"""

from __future__ import annotations

import queue
import random
import threading

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import CancelOutcome, JobState

DURATION_S = 3.0


def test_concurrent_submit_run_poll_wait_keeps_invariants() -> None:
    """Under concurrent load the ledger never over-admits, loses or double-ends a job."""
    max_queue = 16
    table: AsyncJobTable = AsyncJobTable(max_queue=max_queue, job_ttl_ms=50, max_completed=64)
    accepted: list[str] = []
    accepted_lock = threading.Lock()
    work: queue.Queue[str | None] = queue.Queue()
    terminations: dict[str, int] = {}
    term_lock = threading.Lock()
    stop = threading.Event()
    over_admission = threading.Event()
    waiter_results: list[JobState] = []
    cancelled_here: list[str] = []
    payload_takes: dict[str, int] = {}
    take_lock = threading.Lock()
    errors: list[BaseException] = []

    def take_payload(job: str) -> None:
        if table.take_request(job) is not None:
            with take_lock:
                payload_takes[job] = payload_takes.get(job, 0) + 1

    def guarded(fn):
        def inner(*a):
            try:
                fn(*a)
            except BaseException as exc:  # pragma: no cover - surfaced below
                errors.append(exc)
                stop.set()

        return inner

    @guarded
    def submitter(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            job = table.submit({"seed": rng.random()}, task_id=f"t{seed}")
            if table.queue_depth > max_queue:
                over_admission.set()
            if job is not None:
                with accepted_lock:
                    accepted.append(job)
                work.put(job)
            else:
                stop.wait(0.0005)  # back off while full (returns early on stop)

    def count_end(job: str) -> None:
        with term_lock:
            terminations[job] = terminations.get(job, 0) + 1

    @guarded
    def runner(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            job = work.get()
            if job is None:
                return
            outcome = rng.random()
            ended = False
            if outcome < 0.1:
                ended = table.timeout(job, "budget")  # timed out while pending
                if not ended:  # a canceller got there first (then retention, maybe)
                    assert table.state(job) in (JobState.CANCELLED, None)
                    continue
            elif not table.transition_running(job):
                assert table.state(job) in (JobState.CANCELLED, None)  # cancelled while pending
                continue
            else:
                take_payload(job)
                if table.cancel_requested(job):
                    ended = table.terminate(job, JobState.CANCELLED, error="stopped")
                elif outcome < 0.8:
                    ended = table.finish(job, {"ok": True})
                elif outcome < 0.9:
                    ended = table.fail(job, "boom")
                else:
                    ended = table.timeout(job, "budget")
                # a second terminal transition must be refused (cancel too)
                assert not table.fail(job, "again")
                assert table.cancel(job)[0] in (CancelOutcome.FINISHED, CancelOutcome.UNKNOWN)
            assert ended
            count_end(job)

    @guarded
    def canceller(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with accepted_lock:
                job = rng.choice(accepted[-32:]) if accepted else None
            if job is None:
                continue
            outcome, _snap = table.cancel(job)
            if outcome is CancelOutcome.CANCELLED:
                cancelled_here.append(job)
                count_end(job)
            stop.wait(0.0005)

    @guarded
    def poller(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with accepted_lock:
                job = rng.choice(accepted) if accepted else None
            if job is None:
                continue
            if rng.random() < 0.2:
                take_payload(job)  # races the runner: only one of them may get it
            snap = table.snapshot(job)
            if snap is not None and snap.state is JobState.DONE:
                lookup = table.take_result(job)
                assert not lookup.found or lookup.done

    @guarded
    def waiter(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with accepted_lock:
                job = accepted[-1] if accepted else None
            if job is None:
                continue
            snap = table.wait(job, timeout=rng.uniform(0.001, 0.05))
            if snap is not None:
                waiter_results.append(snap.state)

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(4)]
    runners = [threading.Thread(target=runner, args=(10 + i,)) for i in range(2)]
    threads += [threading.Thread(target=poller, args=(20 + i,)) for i in range(3)]
    waiters = [threading.Thread(target=waiter, args=(30 + i,)) for i in range(2)]
    threads += [threading.Thread(target=canceller, args=(40 + i,)) for i in range(2)]
    for t in threads + runners + waiters:
        t.start()
    stop.wait(DURATION_S)
    stop.set()
    for t in threads + waiters:
        t.join(10)
    for _ in runners:
        work.put(None)
    for t in runners:
        t.join(10)

    assert not errors, errors
    assert not any(t.is_alive() for t in threads + runners + waiters), "a thread is stuck"
    assert not over_admission.is_set()
    assert table.queue_depth == 0
    assert len(accepted) == len(set(accepted)), "job id reused"
    assert len(accepted) > 100, "the stress test did too little work to mean anything"
    assert set(terminations) == set(accepted)
    assert all(n == 1 for n in terminations.values())
    assert all(n == 1 for n in payload_takes.values()), "a payload moved out twice"
    assert table.nonterminal_ids() == []
    table.evict_expired()
    assert len(table) <= 64, "retention kept more than max_completed terminal jobs"
    assert waiter_results, "waiters never observed a job"
    assert cancelled_here, "the cancellers never cancelled a pending job"
