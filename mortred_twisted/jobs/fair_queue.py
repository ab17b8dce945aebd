"""``FairQueue``: the order in which pending jobs get a worker, and what each caller
holds (pure: no reactor, no HTTP, no torch).

**Callers, flows, bands.** A *caller* is a job's owner (the principal the gateway
names: ``key:<name>``, or ``""`` for the port itself). Each job has a *band*
(priority): ``low``, ``normal`` or ``high``. A *flow* is one caller's jobs in one
band; within a flow jobs start first in, first out.

**Within a band: start-time fair queueing (SFQ).** A job of weight ``w`` costs
``TAG_SCALE // w`` units of virtual time. At admission it gets the start tag
``S = max(V_band, F_flow)`` where ``V_band`` is the start tag of the band's last
started job and ``F_flow`` the finish tag (``S + cost``) of the flow's previous
job. The band starts its pending job with the smallest ``(S, admission sequence)``.
A caller with weight 2 thus starts twice as many jobs as one with weight 1 while
both have jobs waiting; a caller that arrives behind another's backlog of 500 gets
the tag ``V_band`` and its jobs interleave with the backlog's at once (A 500, B 5,
equal weights: B's five jobs start within the next ten starts).

**Across bands: a reserved share (stride scheduling).** Bands have the fixed
weights :data:`BAND_WEIGHTS` (high 16, normal 4, low 1). Each band has a *pass*;
the non-empty band with the smallest pass starts the next job (ties: the higher
band), and its pass grows by ``BAND_SCALE // weight``. A band that becomes
non-empty takes the pass of the last start if its own is behind (no credit for idle
time). So while every band has work, of each 21 starts 16 are high, 4 normal and
1 low: a higher band mostly runs first, and a low job is never starved: between two
starts of its band at most 17 high and 5 normal jobs start.

**Running again.** A job whose run is given back (the Redis store: a replica
handing it back, or its lease lost) is pending again with its own start tag
(:meth:`FairQueue.requeue`): it keeps its place, ahead of the jobs admitted after
it, and its caller's count of active jobs does not change.

**Quotas.** The queue counts each caller's *active* jobs (pending + running);
admission against a caller's limit is the ledger's (one lock with the model's
``max_queue``).

**Queue position** (:meth:`FairQueue.position`) is an estimate: ``r`` = the job's
rank in its band's order, plus for every other band ``c`` the jobs it would start
meanwhile by its share, ``min(pending_c, r * weight_c // weight_band)``. Exact when
only one band has pending jobs (the common case).

Thread contract: none (the owner's lock guards it). All tags are integers, so the
same order is computed bit for bit by a Lua script on Redis.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Container
from dataclasses import dataclass

#: Priority bands, lowest first (the request field ``priority``).
PRIORITIES: tuple[str, ...] = ("low", "normal", "high")
DEFAULT_PRIORITY = "normal"
#: Reserved share of each band while all have pending jobs (16 : 4 : 1).
BAND_WEIGHTS: dict[str, int] = {"high": 16, "normal": 4, "low": 1}
#: Pass increment of a band start is ``BAND_SCALE // weight`` (1, 4, 16).
BAND_SCALE = 16
#: Virtual-time cost of one job is ``TAG_SCALE // weight`` (lcm of 1..16: exact for
#: the usual weights; integers so Lua doubles agree).
TAG_SCALE = 720_720
#: Largest weight a key may have (the cost stays >= 720).
MAX_WEIGHT = 1000
_RANK = {name: i for i, name in enumerate(PRIORITIES)}


def priority_rank(name: str) -> int:
    """0 for low, 1 normal, 2 high; KeyError for anything else."""
    return _RANK[name]


@dataclass(frozen=True)
class CallerTerms:
    """What a caller is granted on this model (from its API key, via the gateway).

    ``weight`` its share (1..:data:`MAX_WEIGHT`); ``max_pending`` its limit of
    pending + running jobs (None: the model's ``async_max_queue_per_caller``);
    ``max_priority`` the highest band it may ask for.
    """

    weight: int = 1
    max_pending: int | None = None
    max_priority: str = DEFAULT_PRIORITY


DEFAULT_TERMS = CallerTerms()


#: One job: ``(caller, band, (start tag, admission sequence, job id), finish tag,
#: running)``. A plain tuple of atoms, so the garbage collector stops tracking it: a
#: backlog of pending jobs adds nothing to the full collections' scans.
_Entry = tuple[str, str, tuple[int, int, str], int, bool]


class FairQueue:
    """Pending jobs in fair order, running jobs, and per-caller counts.

    Every mutation is O(log n) plus a list insert/delete (a memmove); :meth:`next`
    is O(1) unless ``eligible`` skips jobs.
    """

    def __init__(self) -> None:
        self._bands: dict[str, list[tuple[int, int, str]]] = {b: [] for b in PRIORITIES}
        self._vtime: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        self._pass: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        self._global_pass = 0
        self._finish: dict[tuple[str, str], int] = {}
        self._entries: dict[str, _Entry] = {}
        self._pending: dict[str, int] = {}
        self._running: dict[str, int] = {}

    # -- counts -----------------------------------------------------------------

    def active(self, caller: str) -> int:
        """The caller's pending + running jobs."""
        return self._pending.get(caller, 0) + self._running.get(caller, 0)

    def pending_of(self, caller: str) -> int:
        return self._pending.get(caller, 0)

    def running_of(self, caller: str) -> int:
        return self._running.get(caller, 0)

    @property
    def pending_count(self) -> int:
        return sum(len(q) for q in self._bands.values())

    @property
    def caller_count(self) -> int:
        """Callers holding a pending or running job."""
        return len(set(self._pending) | set(self._running))

    def callers(self) -> list[str]:
        """Callers holding a pending or running job."""
        return sorted(set(self._pending) | set(self._running))

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    # -- transitions --------------------------------------------------------------

    def push(self, job_id: str, caller: str, seq: int, *, weight: int = 1,
             band: str = DEFAULT_PRIORITY) -> int:  # fmt: skip
        """Admit ``job_id`` (pending) for ``caller``; returns its start tag.

        ``seq`` is the admission sequence (ties between equal tags start the older
        job). Raises KeyError for an unknown band, ValueError for a job already in.
        """
        queue = self._bands[band]
        if job_id in self._entries:
            raise ValueError(f"{job_id} is already queued")
        weight = min(max(1, int(weight)), MAX_WEIGHT)
        flow = (caller, band)
        start = max(self._vtime[band], self._finish.get(flow, 0))
        finish = self._finish[flow] = start + TAG_SCALE // weight
        if not queue:  # a band that wakes up gets no credit for its idle time
            self._pass[band] = max(self._pass[band], self._global_pass)
        key = (start, seq, job_id)
        insort(queue, key)
        self._entries[job_id] = (caller, band, key, finish, False)
        self._pending[caller] = self._pending.get(caller, 0) + 1
        return start

    def next(self, eligible: Container[str] | Callable[[str], bool] | None = None) -> str | None:
        """The pending job that starts next (nothing changes), or None.

        With ``eligible`` only those jobs are considered (the others keep their
        place): the runner of one process passes the jobs it has ready.
        """
        test: Callable[[str], bool] | None
        if eligible is None:
            test = None
        elif callable(eligible):
            test = eligible
        else:
            test = eligible.__contains__
        for band in self._band_order():
            for _start, _seq, job_id in self._bands[band]:
                if test is None or test(job_id):
                    return job_id
        return None

    def _band_order(self) -> list[str]:
        live = [b for b in PRIORITIES if self._bands[b]]
        live.sort(key=lambda b: (self._pass[b], -_RANK[b]))
        return live

    def start(self, job_id: str) -> bool:
        """Pending → running: advances the band's virtual time and pass. False when
        ``job_id`` is not pending here."""
        entry = self._entries.get(job_id)
        if entry is None or entry[4]:
            return False
        caller, band, key, finish, _ = entry
        self._unqueue(band, key)
        _dec(self._pending, caller)
        self._vtime[band] = max(self._vtime[band], key[0])
        self._global_pass = max(self._global_pass, self._pass[band])
        self._pass[band] += BAND_SCALE // BAND_WEIGHTS[band]
        self._entries[job_id] = (caller, band, key, finish, True)
        self._running[caller] = self._running.get(caller, 0) + 1
        return True

    def requeue(self, job_id: str) -> bool:
        """Running → pending again, with its own start tag and admission sequence:
        the job is back in its place (the Redis store's hand-back and lost lease;
        the band's virtual time and pass stay where its start moved them). The
        caller's active count is unchanged. False unless ``job_id`` runs here."""
        entry = self._entries.get(job_id)
        if entry is None or not entry[4]:
            return False
        caller, band, key, finish, _ = entry
        queue = self._bands[band]
        if not queue:  # as in push: a band that wakes up gets no credit
            self._pass[band] = max(self._pass[band], self._global_pass)
        insort(queue, key)
        self._entries[job_id] = (caller, band, key, finish, False)
        _dec(self._running, caller)
        self._pending[caller] = self._pending.get(caller, 0) + 1
        return True

    def release(self, job_id: str) -> bool:
        """The job ended (pending: cancelled or expired; running: finished). Its
        caller's counts drop by one; a pending job that was its flow's last gives
        its virtual time back (a job that never ran costs its caller nothing).
        False when unknown."""
        entry = self._entries.pop(job_id, None)
        if entry is None:
            return False
        caller, band, key, finish, running = entry
        flow = (caller, band)
        if running:
            _dec(self._running, caller)
        else:
            self._unqueue(band, key)
            _dec(self._pending, caller)
            if self._finish.get(flow) == finish:
                self._finish[flow] = key[0]
        if not self.active(caller) and self._finish.get(flow, 0) <= self._vtime[band]:
            self._finish.pop(flow, None)  # a tag behind V changes nothing: forget it
        return True

    def _unqueue(self, band: str, key: tuple[int, int, str]) -> None:
        queue = self._bands[band]
        at = bisect_left(queue, key)
        if at < len(queue) and queue[at] == key:
            del queue[at]

    # -- reads ----------------------------------------------------------------------

    def band_of(self, job_id: str) -> str | None:
        entry = self._entries.get(job_id)
        return None if entry is None else entry[1]

    def tag(self, job_id: str) -> int | None:
        """The job's start tag (tests and tools)."""
        entry = self._entries.get(job_id)
        return None if entry is None else entry[2][0]

    def position(self, job_id: str) -> int | None:
        """1-based estimate of the job's place in the start order (module
        docstring); None unless pending."""
        entry = self._entries.get(job_id)
        if entry is None or entry[4]:
            return None
        _caller, own, key, _finish, _running = entry
        queue = self._bands[own]
        rank = bisect_left(queue, key) + 1
        weight = BAND_WEIGHTS[own]
        position = rank
        for band, other in self._bands.items():
            if band != own and other:
                position += min(len(other), rank * BAND_WEIGHTS[band] // weight)
        return position

    def pending_ids(self) -> list[str]:
        """Every pending job in start order (tests, tools; O(n log n))."""
        probe = FairQueue.__new__(FairQueue)
        probe._bands = {b: list(q) for b, q in self._bands.items()}
        probe._pass = dict(self._pass)
        out: list[str] = []
        while True:
            order = probe._band_order()
            if not order:
                return out
            band = order[0]
            out.append(probe._bands[band].pop(0)[2])
            probe._pass[band] += BAND_SCALE // BAND_WEIGHTS[band]


def _dec(counts: dict[str, int], caller: str) -> None:
    left = counts.get(caller, 0) - 1
    if left > 0:
        counts[caller] = left
    else:
        counts.pop(caller, None)
