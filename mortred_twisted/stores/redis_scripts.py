"""The Redis data model of the shared job store, and its Lua scripts (pure).

Keys of one model id (all under one hash tag, so they share a cluster slot)::

    mortred:{<id>}:job:<job_id>  HASH   state, task, created, started (ms of the
                                        Redis clock), completed (ms with µs),
                                        attempt, owner (the replica running it),
                                        progress "s/t", error, request (until
                                        terminal), result; principal (the caller),
                                        seq, cancel, idem, webhook, hook_events, band,
                                        tag (start tag), fin (finish tag)
    mortred:{<id>}:depth         STRING admitted non-terminal jobs (invariant 3)
    mortred:{<id>}:queue         STREAM (no longer written: CLAIM takes the fair
                                        order below; kept for its consumer group)
    mortred:{<id>}:band_<b>      ZSET   "<seq, 15 digits>:<job_id>" of each pending job
                                        of priority band <b> (low, normal, high) -> its
                                        start tag (jobs/fair_queue.py); equal tags
                                        sort by member, i.e. by admission
    mortred:{<id>}:fair          HASH   v:<b> band virtual time, p:<b> band pass, gp
                                        the last start's pass, f:<b>:<caller> a flow's
                                        finish tag, a:<caller> pending + running jobs
    mortred:{<id>}:pending       ZSET   pending job -> admission ms (overdue budget)
    mortred:{<id>}:leases        ZSET   running job -> lease deadline ms
    mortred:{<id>}:done          ZSET   terminal job -> last use (LRU; a use counter)
    mortred:{<id>}:done:<caller> ZSET   the same, for one caller's terminal jobs
    mortred:{<id>}:holders       ZSET   caller -> terminal jobs it holds (retention)
    mortred:{<id>}:done_owner    HASH   terminal job -> its caller (found again by
                                        the TTL sweep once the job's hash expired)
    mortred:{<id>}:uses          STRING the use counter (INCR per terminal/use)
    mortred:{<id>}:sweep         HASH   where MAINTAIN's retention sweep resumes
    mortred:{<id>}:index         ZSET   every job -> admission sequence (listings)
    mortred:{<id>}:seq           STRING the admission sequence (INCR per job)
    mortred:{<id>}:idem2:<n>:<p>:<k>  STRING "<job_id> <fingerprint>": the
                                        Idempotency-Key <k> of principal <p> (<n>: its
                                        length in characters, so the pair is read
                                        back unambiguously), for as long as its job
                                        is retained (same TTL, deleted with it)
    mortred:{<id>}:follow:<job>  STRING set (3 s TTL, refreshed) while an event stream
                                        on some replica follows the job
    mortred:{<id>}:events        pub/sub channel: "t <job_id> <view>" terminal,
                                        "q <job_id>" queued, "c <job_id>" cancel
                                        requested (running), "p <job_id>" progress
                                        (only while the job is followed)

Every multi-key transition is one script, so it is atomic across replicas:
admission check + enqueue (``ADMIT``), claim (``CLAIM``: read the stream, ack and
delete the entry, pending → running under a lease), the terminal transition
(``TERMINATE``, which frees the request, decrements the depth once, enters
retention and publishes), upkeep (``MAINTAIN``: renew this replica's leases,
re-queue the jobs of replicas whose lease expired — or fail them after
``max_attempts`` — time out pending jobs past their budget, forget expired
retention entries) and ``HAND_BACK``. Times come from Redis ``TIME``, so the
replicas' clocks never matter. Terminal jobs get ``PEXPIRE`` (the TTL); beyond
``max_completed`` the terminal transition evicts the least recently used job of the
caller holding the most (ties: the caller whose least recently used job is the
oldest), the policy of :mod:`mortred_twisted.jobs.retention`, so one caller's
finished jobs never evict another's results while that caller is within its share
(``max_completed`` / callers holding finished jobs); with one caller it is plain LRU.
Jobs whose hash expired still count until ``MAINTAIN``'s sweep forgets them. A
non-terminal job is never in ``done`` and never expires.

**Cancel is a fact in the job's hash** (``cancel``), not a message: ``CLAIM`` ends
a flagged job cancelled instead of running it, ``MAINTAIN`` returns the flagged
jobs a replica holds (and ends a flagged job of a lost replica cancelled, whatever
attempts are left), ``PROGRESS`` returns the flag, and ``TERMINATE`` never ends a
flagged job ``done``. The ``c`` message only makes the common case fast.

**Keys.** The scripts live in ``lua/*.lua`` (package data), each prefixed with
``prelude.lua``. Every key a caller can name is passed in ``KEYS``
(:func:`script_keys`: the script's fixed keys, then the job's hash, idempotency or
follow key); the hashes of jobs a script finds itself (in the queue stream, an
expired lease, the retention or listing index) are named from the prefix, which
carries the hash tag, so every key of one model id is in one cluster slot (a
cluster-mode ``redis-server``, which refuses a script touching another slot than
its declared keys — scripts carry the ``#!lua`` line, so Redis 7 or later — runs
the store's operations in tests/runtime/test_redis_link.py).
"""

from __future__ import annotations

from importlib import resources

from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.types import JobSnapshot, ResultLookup

GROUP = "workers"
LOST_REPLICA_ERROR = "interrupted: replica lost"


def key_prefix(model_id: str) -> str:
    """``mortred:{<id>}:`` — the hash tag keeps one model's keys in one slot."""
    return f"mortred:{{{model_id}}}:"


#: Retention entries MAINTAIN checks per set and call (see its last loop).
SWEEP_BATCH = 256
#: Index entries one LIST call scans at most (a bounded time holding Redis).
LIST_SCAN = 2000

#: The fair order (jobs/fair_queue.py): its state hash and one ZSET of pending jobs
#: per priority band, scored by start tag.
_FAIR = ("fair", "band_low", "band_normal", "band_high")
#: Retention per caller (jobs/retention.py): who holds how many terminal jobs, and
#: each terminal job's caller; with ``done`` and the per-caller ``done:<caller>``.
_KEPT = ("holders", "done_owner")
#: MAINTAIN's keys before the fair ones.
_UPKEEP = ("leases", "pending", "queue", "depth", "done", "uses", *_KEPT, "index", "sweep")
#: The fixed keys (names after the prefix) each script receives first in KEYS, in
#: this order; then the keys the caller names per call (``dynamic``).
_SCRIPT_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "admit": (
        ("depth", "done", "uses", *_KEPT, "seq", "pending", "index", "queue", *_FAIR),
        ("job", "idem"),
    ),
    "claim": (
        ("queue", "pending", "leases", "depth", "done", "uses", *_KEPT, "index", *_FAIR),
        (),
    ),
    "terminate": (
        ("depth", "pending", "leases", "done", "uses", *_KEPT, "index", *_FAIR),
        ("job",),
    ),
    "snapshot": (("pending", "done", "uses", *_KEPT, *_FAIR), ("job",)),
    "result": (("done", "uses", *_KEPT), ("job",)),
    "progress": ((), ("job", "follow")),
    "hand_back": (("leases", "pending", "queue", *_FAIR), ("job",)),
    "maintain": ((*_UPKEEP, *_FAIR), ()),  # then the hash of every held job
    "cancel": (
        ("depth", "pending", "leases", "done", "uses", *_KEPT, "index", *_FAIR),
        ("job",),
    ),
    "job_extras": ((), ("job",)),
    "list": (("index", "pending", *_FAIR), ()),
    "queue": (("pending", "depth", *_FAIR), ()),
}


#: Redis 7 script flags line: with it, Redis refuses a script that touches a key in
#: another cluster slot than its declared keys (without it, legacy scripts may).
SHEBANG = "#!lua\n"


def _lua(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def _compose(name: str) -> str:
    fixed, dynamic = _SCRIPT_KEYS[name]
    names = ", ".join(f"'{n}'" for n in (*fixed, *dynamic))
    head = (
        f"{SHEBANG}local KEY_NAMES = {{{names}}}\n"
        f"local SWEEP_BATCH = {SWEEP_BATCH}\nlocal LIST_SCAN = {LIST_SCAN}\n"
    )
    return head + _lua("prelude") + _lua(name)


def script_keys(name: str, prefix: str, dynamic: tuple[str, ...] = ()) -> list[str]:
    """KEYS for one call of script ``name``: its fixed keys under ``prefix``, then
    ``dynamic`` (the job's hash, its idempotency key, …) as given."""
    fixed, _ = _SCRIPT_KEYS[name]
    return [prefix + key for key in fixed] + list(dynamic)


def job_key(prefix: str, job_id: str) -> str:
    return f"{prefix}job:{job_id}"


def idem_key(prefix: str, principal: str, key: str) -> str:
    """The key remembering ``(principal, key)``'s job: ``idem2:<n>:<principal>:<key>``
    with ``n`` the principal's length in characters, so every pair has its own name
    (a principal or key holding ``:`` cannot pass for another pair). ``idem2``, not the
    ``idem:<p>:<k>`` of earlier versions: a key those left behind never answers for
    a pair of this encoding."""
    return f"{prefix}idem2:{len(principal)}:{principal}:{key}"


def follow_key(prefix: str, job_id: str) -> str:
    return f"{prefix}follow:{job_id}"


SCRIPTS: dict[str, str] = {name: _compose(name) for name in _SCRIPT_KEYS}
#: FOLLOW receives only follow keys (any number): no prelude.
SCRIPTS["follow"] = SHEBANG + _lua("follow")


def reply_text(value: bytes | str | None) -> str | None:
    """A Redis reply value as text (replies are bytes: the link sets no charset)."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _int(value: bytes | str | None) -> int | None:
    text = reply_text(value)
    return int(text) if text else None


def _ms(value: bytes | str | None) -> float | None:
    """A stored time in ms: whole (``created``, ``started``) or with µs (``completed``)."""
    text = reply_text(value)
    return float(text) if text else None


def decode_snapshot(job_id: str, reply: list[object] | None) -> JobSnapshot | None:
    """The :class:`JobSnapshot` of a ``SNAPSHOT`` reply (None: unknown job)."""
    if not reply:
        return None
    state, task, created, started, completed, error, progress, _attempt, now = reply[:9]
    cancel = reply_text(reply[9]) if len(reply) > 9 else None  # type: ignore[arg-type]
    position = _int(reply[10]) if len(reply) > 10 else None  # type: ignore[arg-type]
    owner = reply_text(reply[11]) if len(reply) > 11 else None  # type: ignore[arg-type]
    created_ms = _int(created) or 0  # type: ignore[arg-type]
    started_ms = _int(started)  # type: ignore[arg-type]
    completed_ms = _ms(completed)  # type: ignore[arg-type]
    end = completed_ms if completed_ms is not None else int(now)  # type: ignore[call-overload]
    steps = None
    text = reply_text(progress)  # type: ignore[arg-type]
    if text:
        step, _, total = text.partition("/")
        steps = (int(step), int(total))
    return JobSnapshot(
        job_id=job_id,
        state=JobState(reply_text(state)),  # type: ignore[arg-type]
        task_id=reply_text(task) or "",  # type: ignore[arg-type]
        elapsed_ms=max(0, int(end - created_ms)),
        error=reply_text(error),  # type: ignore[arg-type]
        progress=steps,
        queued_ms=None if started_ms is None else started_ms - created_ms,
        completed_unix=None if completed_ms is None else completed_ms / 1000.0,
        queue_position=position or None,
        cancel_requested=bool(cancel) and reply_text(state) == "running",  # type: ignore[arg-type]
        owner=owner or "",
    )


def decode_result(reply: list[object] | None) -> ResultLookup:
    """The :class:`ResultLookup` of a ``RESULT`` reply."""
    if not reply:
        return ResultLookup(found=False)
    state, task, result = reply[:3]
    owner = reply_text(reply[3]) if len(reply) > 3 else None  # type: ignore[arg-type]
    return ResultLookup(
        found=True,
        state=JobState(reply_text(state)),  # type: ignore[arg-type]
        result=result,
        task_id=reply_text(task) or "",  # type: ignore[arg-type]
        owner=owner or "",
    )
