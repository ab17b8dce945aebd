"""The fair order of pending jobs (jobs/fair_queue.py) and the ledger that uses it:
weighted fair queueing across callers, priority bands with a reserved share, per-
caller quotas and per-caller retention."""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mortred_twisted.jobs.fair_queue import (
    BAND_SCALE,
    BAND_WEIGHTS,
    PRIORITIES,
    TAG_SCALE,
    CallerTerms,
    FairQueue,
)
from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState


def _drain(q: FairQueue, n: int) -> list[str]:
    out = []
    for _ in range(n):
        job_id = q.next()
        assert job_id is not None
        assert q.start(job_id)
        out.append(job_id)
    return out


def test_a_small_caller_behind_a_flood_starts_within_ten_starts() -> None:
    """A has 500 jobs queued, B then submits 5 (equal weights): B's five start
    within the next ten starts, each within two starts of the previous one."""
    q = FairQueue()
    for i in range(500):
        q.push(f"a{i}", "A", i)
    _drain(q, 3)
    for i in range(5):
        q.push(f"b{i}", "B", 1000 + i)
    order = _drain(q, 10)
    assert [j for j in order if j.startswith("b")] == [f"b{i}" for i in range(5)]
    assert order.index("b4") < 10
    assert q.position("a100") is not None


def test_weights_share_starts_in_proportion() -> None:
    """With both callers backlogged, a weight-3 caller starts three jobs for each
    of a weight-1 caller's."""
    q = FairQueue()
    for i in range(100):
        q.push(f"h{i}", "heavy", 2 * i, weight=3)
        q.push(f"l{i}", "light", 2 * i + 1, weight=1)
    order = _drain(q, 80)
    assert sum(j.startswith("h") for j in order) == 60


def test_fifo_within_one_caller_and_band() -> None:
    """One caller's jobs of one band start in the order they were admitted."""
    q = FairQueue()
    for i in range(20):
        q.push(f"j{i}", "A", i, weight=1 + i % 3)
    assert _drain(q, 20) == [f"j{i}" for i in range(20)]


def test_a_high_job_goes_first_and_low_keeps_its_reserved_share() -> None:
    """A high job submitted behind a normal backlog starts next; while high, normal
    and low are all backlogged, each 21 starts give 16 high, 4 normal and 1 low, so
    a low job is never starved by a flood of high ones."""
    q = FairQueue()
    seq = 0
    for band in ("low", "normal"):
        for i in range(100):
            seq += 1
            q.push(f"{band}{i}", "A", seq, band=band)
    _drain(q, 2)
    seq += 1
    q.push("urgent", "B", seq, band="high")
    assert q.next() == "urgent"
    for i in range(200):
        seq += 1
        q.push(f"high{i}", "C", seq, band="high")
    order = _drain(q, 21 * 5)
    counts = {b: sum(j.startswith(b) for j in order) for b in ("high", "normal", "low")}
    counts["high"] += order.count("urgent")
    expected = {"high": 80, "normal": 20, "low": 5}
    assert all(abs(counts[b] - expected[b]) <= 1 for b in expected), counts


def test_position_is_the_start_order_in_one_band() -> None:
    """With one band pending, queue_position is exactly the place in the start
    order (1 = next)."""
    q = FairQueue()
    for i in range(30):
        q.push(f"a{i}", "A", i)
    for i in range(6):
        q.push(f"b{i}", "B", 100 + i, weight=2)
    order = q.pending_ids()
    assert [q.position(j) for j in order] == list(range(1, len(order) + 1))
    assert _drain(q, len(order)) == order


def test_caller_quota_refuses_only_that_caller() -> None:
    """A caller at its max_pending is refused with over_quota (its own limit), while
    another caller is still admitted; ending one of its jobs admits it again."""
    t: AsyncJobTable[str] = AsyncJobTable(max_queue=10, max_pending_per_caller=3)
    ids = [t.admit("r", owner="A").job_id for _ in range(3)]
    refused = t.admit("r", owner="A")
    assert refused.job_id is None and refused.over_quota and refused.limit == 3
    assert t.admit("r", owner="B").job_id is not None
    one = CallerTerms(max_pending=1)
    own = t.admit("r", owner="C", terms=one)
    assert own.job_id is not None and t.admit("r", owner="C", terms=one).over_quota
    assert ids[0] is not None and t.transition_running(ids[0])
    assert t.admit("r", owner="A").over_quota  # running jobs count too
    t.finish(ids[0], 1)
    assert t.admit("r", owner="A").job_id is not None


def test_the_model_queue_stays_the_ceiling() -> None:
    """Callers within their own limits are still refused (not over_quota) when the
    model's async_max_queue is reached."""
    t: AsyncJobTable[str] = AsyncJobTable(max_queue=2, max_pending_per_caller=5)
    assert t.admit("r", owner="A").job_id and t.admit("r", owner="B").job_id
    full = t.admit("r", owner="C")
    assert full.job_id is None and not full.over_quota


def test_one_callers_results_do_not_evict_anothers_within_its_share() -> None:
    """max_completed 4 and two callers: B's two results survive A finishing 10."""
    t: AsyncJobTable[str] = AsyncJobTable(max_queue=100, max_completed=4, job_ttl_ms=0)

    def run(owner: str) -> str:
        job_id = t.admit("r", owner=owner).job_id
        assert job_id is not None
        t.transition_running(job_id)
        t.finish(job_id, owner)
        return job_id

    b_jobs = [run("B"), run("B")]
    for _ in range(10):
        run("A")
    t.evict_expired()
    assert all(t.snapshot(j) is not None for j in b_jobs)
    assert len(t) == 4


def test_ledger_starts_jobs_in_fair_order() -> None:
    """next_pending names A's and B's jobs in turn although A submitted first."""
    t: AsyncJobTable[str] = AsyncJobTable(max_queue=100)
    a = [t.admit("r", owner="A").job_id for _ in range(5)]
    b = [t.admit("r", owner="B").job_id for _ in range(2)]
    order = []
    while (job_id := t.next_pending()) is not None:
        assert t.transition_running(job_id)
        order.append(job_id)
    assert order == [a[0], b[0], a[1], b[1], a[2], a[3], a[4]]
    view = t.queue_view()
    assert (view.pending, view.running) == (0, 7)
    assert {line.caller: line.running for line in view.callers} == {"A": 5, "B": 2}


# -- the state machine ----------------------------------------------------------------


class _Reference:
    """The fair order spelled naively (lists and linear scans), from the module's
    docstring, to check the fast structure against."""

    def __init__(self) -> None:
        self.vtime = dict.fromkeys(PRIORITIES, 0)
        self.passes = dict.fromkeys(PRIORITIES, 0)
        self.global_pass = 0
        self.finish: dict[tuple[str, str], int] = {}
        self.pending: list[tuple[str, int, int, str]] = []  # band, tag, seq, id
        self.last: dict[str, tuple[tuple[str, str], int, int]] = {}  # id -> flow, S, F

    def push(self, job_id: str, caller: str, seq: int, weight: int, band: str) -> None:
        if not any(p[0] == band for p in self.pending):
            self.passes[band] = max(self.passes[band], self.global_pass)
        start = max(self.vtime[band], self.finish.get((caller, band), 0))
        self.finish[(caller, band)] = start + TAG_SCALE // weight
        self.last[job_id] = ((caller, band), start, self.finish[(caller, band)])
        self.pending.append((band, start, seq, job_id))

    def next(self) -> str | None:
        bands = {p[0] for p in self.pending}
        if not bands:
            return None
        band = min(bands, key=lambda b: (self.passes[b], -PRIORITIES.index(b)))
        return min((p for p in self.pending if p[0] == band), key=lambda p: (p[1], p[2]))[3]

    def start(self, job_id: str) -> None:
        entry = next(p for p in self.pending if p[3] == job_id)
        self.pending.remove(entry)
        band = entry[0]
        self.vtime[band] = max(self.vtime[band], entry[1])
        self.global_pass = max(self.global_pass, self.passes[band])
        self.passes[band] += BAND_SCALE // BAND_WEIGHTS[band]

    def drop(self, job_id: str) -> None:
        """A pending job that ends gives its tag back if it was its flow's last."""
        self.pending = [p for p in self.pending if p[3] != job_id]
        flow, start, finish = self.last[job_id]
        if self.finish[flow] == finish:
            self.finish[flow] = start


CALLERS = {"a": CallerTerms(weight=1, max_pending=4), "b": CallerTerms(weight=2),
           "c": CallerTerms(weight=3, max_pending=2)}  # fmt: skip
PER_CALLER = 5
MAX_QUEUE = 9
MAX_WEIGHT = 3


class FairLedgerMachine(RuleBasedStateMachine):
    """Admission, pick, cancel and completion on the ledger: no caller above its
    quota, every pick is the reference's fair choice, no pending job waits longer
    than its bound."""

    def __init__(self) -> None:
        super().__init__()
        ids = itertools.count(1)
        self.t: AsyncJobTable[str] = AsyncJobTable(
            max_queue=MAX_QUEUE, max_pending_per_caller=PER_CALLER, max_completed=5,
            id_factory=lambda: f"job_{next(ids):06d}",
        )  # fmt: skip
        self.ref = _Reference()
        self.seq = 0
        self.owner: dict[str, str] = {}
        self.running: list[str] = []
        self.waited: dict[str, int] = {}  # pending job -> starts since admission
        self.bound: dict[str, int] = {}

    def _limit(self, caller: str) -> int:
        return CALLERS[caller].max_pending or PER_CALLER

    @rule(caller=st.sampled_from(sorted(CALLERS)), band=st.sampled_from(PRIORITIES))
    def admit(self, caller: str, band: str) -> None:
        active = sum(1 for o in self.owner.values() if o == caller)
        ahead = len(self.waited)
        got = self.t.admit("r", owner=caller, terms=CALLERS[caller], priority=band)
        if active >= self._limit(caller):
            assert got.job_id is None and got.over_quota
            return
        if len(self.owner) >= MAX_QUEUE:
            assert got.job_id is None and not got.over_quota
            return
        assert got.job_id is not None
        self.seq += 1
        self.ref.push(got.job_id, caller, self.seq, CALLERS[caller].weight, band)
        self.owner[got.job_id] = caller
        self.waited[got.job_id] = 0
        # Jobs ahead in the band now, those of each flow admitted later with a
        # smaller tag, and the other bands' starts per start of this band (<= 22).
        flows = len(CALLERS)
        self.bound[got.job_id] = 23 * (ahead + 2 + flows * ((ahead + 1) * MAX_WEIGHT + 1))

    @rule()
    def pick(self) -> None:
        expected = self.ref.next()
        got = self.t.next_pending()
        assert got == expected
        if got is None:
            return
        assert self.t.transition_running(got)
        self.ref.start(got)
        del self.waited[got]
        for job_id in self.waited:
            self.waited[job_id] += 1
        self.running.append(got)

    @precondition(lambda self: bool(self.waited))
    @rule(data=st.data())
    def cancel_pending(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.waited)))
        self.t.cancel(job_id)
        self.ref.drop(job_id)
        del self.waited[job_id]
        del self.owner[job_id]

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), ok=st.booleans())
    def complete(self, data: st.DataObject, ok: bool) -> None:
        job_id = data.draw(st.sampled_from(self.running))
        self.running.remove(job_id)
        del self.owner[job_id]
        assert self.t.finish(job_id, 1) if ok else self.t.fail(job_id, "x")

    @invariant()
    def no_caller_above_its_quota(self) -> None:
        view = self.t.queue_view()
        for line in view.callers:
            assert line.pending + line.running <= self._limit(line.caller)
        assert view.depth <= MAX_QUEUE and view.depth == len(self.owner)

    @invariant()
    def nothing_starves(self) -> None:
        for job_id, waited in self.waited.items():
            assert waited <= self.bound[job_id]
            assert self.t.snapshot(job_id).state is JobState.PENDING


TestFairLedger = FairLedgerMachine.TestCase
TestFairLedger.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def test_a_requeued_job_is_back_in_its_place() -> None:
    """A running job given back (hand-back, lost lease) is pending again ahead of the
    jobs admitted after it, and its caller's active count is unchanged."""
    q = FairQueue()
    for i in range(3):
        q.push(f"a{i}", "A", i)
    q.push("b0", "B", 3)
    assert _drain(q, 2) == ["a0", "b0"]
    assert q.requeue("a0") and not q.requeue("a0") and not q.requeue("a1")
    assert (q.active("A"), q.pending_of("A"), q.running_of("A")) == (3, 3, 0)
    assert q.pending_ids() == ["a0", "a1", "a2"] and q.position("a0") == 1
    assert _drain(q, 3) == ["a0", "a1", "a2"]
