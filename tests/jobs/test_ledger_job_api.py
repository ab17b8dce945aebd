"""The ledger's job-API operations: cancel, idempotent admission, listing, queue position."""

from __future__ import annotations

import threading

import pytest

from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import CancelOutcome, JobState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def table(**kw: object) -> tuple[AsyncJobTable, FakeClock]:
    clock = FakeClock()
    defaults = {"max_queue": 8, "job_ttl_ms": 10_000, "max_completed": 100}
    defaults.update(kw)
    return AsyncJobTable(clock=clock, wall_clock=clock, **defaults), clock  # type: ignore[arg-type]


def test_cancel_of_a_pending_job_ends_it_at_once_and_frees_its_slot() -> None:
    """A pending job cancelled ends cancelled, its depth slot is freed, it can never run."""
    t, _ = table(max_queue=1)
    job = t.submit("r", "req")
    assert job is not None and t.submit("r2") is None
    outcome, snap = t.cancel(job)
    assert outcome is CancelOutcome.CANCELLED
    assert snap is not None and snap.state is JobState.CANCELLED and snap.terminal
    assert t.queue_depth == 0 and t.submit("r3") is not None
    assert not t.transition_running(job)
    assert t.take_result(job).state is JobState.CANCELLED and not t.take_result(job).done


def test_cancel_of_a_running_job_only_flags_it() -> None:
    """A running job is flagged; it stays running (its runner ends it) and depth is kept."""
    t, _ = table()
    job = t.submit("r")
    assert t.transition_running(job)
    outcome, snap = t.cancel(job)
    assert outcome is CancelOutcome.REQUESTED
    assert snap.state is JobState.RUNNING and snap.cancel_requested
    assert t.cancel_requested(job) and t.queue_depth == 1
    assert t.terminate(job, JobState.CANCELLED, error="cancelled by request")
    assert t.queue_depth == 0
    assert not t.finish(job, "late result")  # the absorbing state wins
    assert not t.snapshot(job).cancel_requested


def test_cancel_of_finished_and_unknown_jobs() -> None:
    """A finished job is left as it is (FINISHED); an unknown id is UNKNOWN."""
    t, _ = table()
    job = t.submit("r")
    t.transition_running(job)
    t.finish(job, {"ok": 1})
    outcome, snap = t.cancel(job)
    assert outcome is CancelOutcome.FINISHED and snap.state is JobState.DONE
    assert t.cancel("job_nope") == (CancelOutcome.UNKNOWN, None)


def test_terminate_refuses_a_non_terminal_target() -> None:
    """terminate() only takes terminal states."""
    t, _ = table()
    with pytest.raises(ValueError):
        t.terminate(t.submit("r"), JobState.RUNNING)


def test_same_key_same_body_replays_and_admits_nothing() -> None:
    """A repeated key with the same fingerprint returns the first job, depth unchanged."""
    t, _ = table()
    first = t.admit("r", owner="alice", idempotency_key="k", fingerprint="f1")
    again = t.admit("r", owner="alice", idempotency_key="k", fingerprint="f1")
    assert first.job_id and not first.replayed
    assert again.job_id == first.job_id and again.replayed
    assert t.queue_depth == 1 and len(t) == 1


def test_same_key_other_body_conflicts_and_keys_are_scoped_per_owner() -> None:
    """Another body under a used key is a conflict; another owner's same key is separate."""
    t, _ = table()
    first = t.admit("r", owner="alice", idempotency_key="k", fingerprint="f1")
    assert t.admit("r", owner="alice", idempotency_key="k", fingerprint="f2").conflict
    bob = t.admit("r", owner="bob", idempotency_key="k", fingerprint="f2")
    assert bob.job_id not in (None, first.job_id) and not bob.replayed


def test_a_key_is_replayed_after_the_job_ends_and_forgotten_with_it() -> None:
    """While the job is retained its key replays it (even when done); after eviction
    the key admits a new job."""
    t, clock = table()
    first = t.admit("r", idempotency_key="k", fingerprint="f").job_id
    t.transition_running(first)
    t.finish(first, 1)
    assert t.admit("r", idempotency_key="k", fingerprint="f")[:3] == (first, True, False)
    clock.now += 11  # past the 10 s TTL
    fresh = t.admit("r", idempotency_key="k", fingerprint="f")
    assert fresh.job_id != first and not fresh.replayed


def test_a_full_queue_still_replays_a_known_key() -> None:
    """A retry of an admitted job is answered even when the queue is full."""
    t, _ = table(max_queue=1)
    first = t.admit("r", idempotency_key="k", fingerprint="f").job_id
    assert t.admit("x", idempotency_key="other", fingerprint="f").job_id is None
    assert t.admit("r", idempotency_key="k", fingerprint="f")[:3] == (first, True, False)


def test_concurrent_submits_with_one_key_create_one_job() -> None:
    """Sixteen threads racing one key admit exactly one job; all see its id."""
    t, _ = table(max_queue=64)
    seen: list[str | None] = []
    barrier = threading.Barrier(16)

    def submit() -> None:
        barrier.wait()
        seen.append(t.admit("r", owner="o", idempotency_key="k", fingerprint="f").job_id)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(seen)) == 1 and None not in seen
    assert t.queue_depth == 1 and len(t) == 1


def test_queue_position_counts_pending_jobs_ahead_in_admission_order() -> None:
    """Position 1 is next; running, cancelled or finished jobs ahead stop counting."""
    t, _ = table()
    a, b, c = t.submit("a"), t.submit("b"), t.submit("c")
    assert [t.snapshot(j).queue_position for j in (a, b, c)] == [1, 2, 3]
    t.transition_running(a)
    assert t.snapshot(a).queue_position is None
    assert [t.snapshot(j).queue_position for j in (b, c)] == [1, 2]
    t.cancel(b)
    assert t.snapshot(c).queue_position == 1 and t.pending_count == 1


def test_listing_is_newest_first_per_owner_with_state_filter_and_cursor() -> None:
    """Owners see their own jobs, newest first, paged by an opaque cursor."""
    t, _ = table(max_queue=32)
    alice = [t.admit(str(i), owner="alice").job_id for i in range(5)]
    bob = t.admit("b", owner="bob").job_id
    t.transition_running(alice[4])
    page = t.list_jobs(owner="alice", limit=2)
    assert [s.job_id for s in page.jobs] == [alice[4], alice[3]]
    page2 = t.list_jobs(owner="alice", limit=2, cursor=page.next_cursor)
    assert [s.job_id for s in page2.jobs] == [alice[2], alice[1]]
    page3 = t.list_jobs(owner="alice", limit=2, cursor=page2.next_cursor)
    assert [s.job_id for s in page3.jobs] == [alice[0]] and page3.next_cursor is None
    pending = t.list_jobs(owner="alice", states=frozenset({JobState.PENDING}), limit=10)
    assert alice[4] not in [s.job_id for s in pending.jobs] and len(pending.jobs) == 4
    everyone = t.list_jobs(owner=None, limit=10)
    assert everyone.jobs[0].job_id == bob and len(everyone.jobs) == 6


@pytest.mark.parametrize("cursor", ["x1", "c", "c-1", "c1e3", "c" + "9" * 30])
def test_a_malformed_cursor_is_refused(cursor: str) -> None:
    """Cursors are ours (c<number>); anything else is a ValueError (HTTP 400)."""
    t, _ = table()
    with pytest.raises(ValueError):
        t.list_jobs(owner=None, cursor=cursor)
