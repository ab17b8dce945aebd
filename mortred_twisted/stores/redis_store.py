"""``RedisJobStore``: the :class:`~mortred_twisted.jobs.store.JobStore` shared by every
replica of one model id, on Redis (data model and scripts in
:mod:`mortred_twisted.stores.redis_scripts`).

Pull mode: a replica takes a job with :meth:`claim_next` only when it has a free
worker; the job runs under a lease (``job_lease_ms``) that :meth:`maintain`
renews; a replica that stops renewing (killed, machine gone) has its jobs re-queued
by any other replica's :meth:`maintain` with ``attempt + 1``, up to
``job_max_attempts``, then they end ``failed`` ("interrupted: replica lost").

Events: every terminal transition is published on the model's channel and
becomes ``count_by_name(job_id)`` on this process's
:class:`~mortred_twisted.runtime.counters.NamedCounters`, so a ``/wait`` parked
on any replica wakes when any replica ends the job. The event carries the job's
terminal view, which answers the woken waiters' :meth:`snapshot` while the event is
delivered (no second round trip); one that does not decode to a terminal snapshot is
ignored and they read Redis. After each (re)subscription
the jobs that local waiters wait for are re-read and the terminal ones counted:
no event is lost between subscribing and reading. "Queued" events call
``on_queued`` (the runner's :meth:`~mortred_twisted.runtime.runner.JobRunner.kick`).
Jobs a script ends by itself (``MAINTAIN``: overdue pending jobs, lost replicas'
jobs; ``CLAIM``: flagged jobs handed back; an unreadable request at claim) are
listed in that script's reply and reported once, to the replica that ran it, by
``on_ended`` (the runtime counts them and sends their webhooks).

A terminal transition that cannot be written because Redis is away is retried
until it is (the job keeps its lease meanwhile), so a job that finished during
an outage is not re-run.

**Cancel is read, not only heard.** The ``c`` message stops a held job at once;
the flag in the job's hash is read again by every lease renewal (:meth:`maintain`,
every third of a lease at most, and after every resubscription) and by every
progress write, so a cancel announced while this replica's subscriber was deaf, or
before its claim's reply arrived, still stops the run (``on_cancel``, which may be
called more than once per job). A ``c`` for a job not (yet) held is remembered for
a while and applied when the claim's reply comes in.

**Progress** (:meth:`set_progress`, any thread) is coalesced per job
(:class:`~mortred_twisted.stores.redis_progress.ProgressWriter`): at most five
writes a second plus the last step, one reactor hop per write.
The write publishes a ``p`` event only while some replica's event stream follows
the job: each replica refreshes a short-lived ``follow`` key for the jobs its
streams follow (once a second, only while it has any).

Thread contract: reactor thread, except :meth:`set_progress` (any thread).
"""

from __future__ import annotations

import json
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger

from mortred_twisted.jobs.fair_queue import (
    DEFAULT_PRIORITY,
    DEFAULT_TERMS,
    MAX_WEIGHT,
    CallerTerms,
)
from mortred_twisted.jobs.ledger import new_job_id, parse_cursor
from mortred_twisted.jobs.states import TERMINAL_STATES, CancelOutcome, JobState
from mortred_twisted.jobs.store import Claim, StoreUnavailable, WakeCounters
from mortred_twisted.jobs.types import (
    Admission,
    CallerLine,
    JobPage,
    JobSnapshot,
    QueueView,
    ResultLookup,
)
from mortred_twisted.stores.redis_link import RedisLink
from mortred_twisted.stores.redis_progress import ProgressWriter
from mortred_twisted.stores.redis_scripts import (
    LOST_REPLICA_ERROR,
    decode_result,
    decode_snapshot,
    follow_key,
    idem_key,
    job_key,
    key_prefix,
    reply_text,
    script_keys,
)

log = Logger()


__all__ = ["LOST_REPLICA_ERROR", "RedisJobStore", "replica_name"]

RETRY_TERMINAL_S = 0.25
#: how often this replica refreshes the follow keys of the jobs its streams follow
FOLLOW_REFRESH_S = 1.0
FOLLOW_TTL_MS = 3000
#: how long a ``c`` message for a job not held here is remembered (its claim's
#: reply may still be on the way); at most EARLY_CANCELS of them
EARLY_CANCEL_S = 30.0
EARLY_CANCELS = 1024
EVENTS_SUFFIX = "#events"


def replica_name() -> str:
    """This process's consumer/owner name: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_job_id()[4:12]}"


#: Pending jobs ``queue_view`` reads to find each caller's oldest (a bounded scan).
QUEUE_SCAN = 1000


class RedisJobStore:
    """See the module docstring. Build, then :meth:`start`; :meth:`stop` at exit."""

    pull = True
    shared = True
    #: Admission takes ``terms``/``priority``; CLAIM starts jobs in the fair order.
    fair = True

    def __init__(
        self,
        *,
        reactor: Any,
        link_factory: Callable[..., RedisLink],
        model_id: str,
        counters: WakeCounters,
        max_queue: int,
        job_ttl_ms: int,
        max_completed: int,
        lease_ms: int,
        max_attempts: int,
        budget_ms: int,
        encode: Callable[[Any], bytes],
        decode: Callable[[bytes], Any],
        owner: str | None = None,
        max_pending_per_caller: int = 0,
    ) -> None:
        self._reactor = reactor
        self._per_caller = max(0, max_pending_per_caller)
        self._prefix = key_prefix(model_id)
        self._counters = counters
        self._max_queue = max_queue
        self._ttl_ms = job_ttl_ms
        self._max_completed = max_completed
        self._lease_ms = lease_ms
        self._max_attempts = max_attempts
        self._budget_ms = budget_ms
        self._encode = encode
        self._decode = decode
        self.owner = owner or replica_name()
        self.on_queued: Callable[[], None] | None = None
        #: a running job was asked to stop (by any replica): the runtime stops it here
        self.on_cancel: Callable[[str], None] | None = None
        #: a job changed on some replica (progress, terminal): wake event streams
        self.on_change: Callable[[str], None] | None = None
        #: a job this replica's scripts ended although no caller asked for that end
        #: (upkeep: past its budget, a lost replica's; a flagged job at claim; an
        #: unreadable request): called once per such job, with its terminal state, so
        #: the runtime counts it and sends its webhook (every other end is its
        #: caller's: the runner's terminate, the cancel route)
        self.on_ended: Callable[[str, JobState], None] | None = None
        self._depth = 0
        self._held: dict[str, int] = {}  # job id -> attempt, jobs this replica runs
        self._handed_back: set[str] = set()  # its late end must not touch the job
        self._ending: set[str] = set()  # held jobs whose terminal write is under way
        #: the views carried by terminal events, each only while its event is delivered
        self._ended_views: dict[str, JobSnapshot] = {}
        self._stopped = False
        # c messages for jobs not held (yet): job id -> when it arrived
        self._early_cancels: OrderedDict[str, float] = OrderedDict()
        self._progress = ProgressWriter(reactor, self._write_progress)
        self._resync_pending = False
        self._follow = LoopingCall(self._refresh_follows)
        self._follow.clock = reactor
        self.link = link_factory(
            reactor,
            channel=self._prefix + "events",
            stream=self._prefix + "queue",
            on_event=self._on_event,
            on_subscribed=self._resync_waiters,
            on_connected=self._reconnected,
        )
        # Leases of other replicas are not reclaimed before this time: after an
        # outage longer than a lease every lease looks expired, and the replicas
        # still running those jobs need one lease period to renew them.
        self._reclaim_from = 0.0
        #: False for an admission-only client (the gateway's, http/gateway_admission.py):
        #: it holds no job, so (re)connecting runs no MAINTAIN (whose ends are
        #: reported to the replica that ran it, to count them and send webhooks)
        self.upkeep = True

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.link.start()
        self._follow.start(FOLLOW_REFRESH_S, now=False)

    def when_connected(self) -> Deferred[None]:
        """Fires once Redis has been reached (scripts loaded, queue group made)."""
        return self.link.when_connected()

    def stop(self) -> Deferred[Any]:
        self._stopped = True
        if self._follow.running:
            self._follow.stop()
        self._progress.stop()
        return self.link.stop()

    def _script(self, name: str, *args: Any, keys: tuple[str, ...] = ()) -> Deferred[Any]:
        """``EVALSHA`` of ``name`` with its fixed keys, then ``keys`` (the job's
        hash, …): every key the caller can name is declared."""
        return self.link.script(name, script_keys(name, self._prefix, keys), args)

    def _job(self, job_id: str) -> tuple[str]:
        return (job_key(self._prefix, job_id),)

    # -- JobStore -------------------------------------------------------------------

    @property
    def max_queue(self) -> int:
        return self._max_queue

    @property
    def queue_depth(self) -> int:
        return self._depth

    def submit(self, request: Any, task_id: str = "") -> Deferred[str | None]:
        return self.admit(request, task_id).addCallback(lambda admission: admission.job_id)

    def admit(
        self,
        request: Any,
        task_id: str = "",
        *,
        owner: str = "",
        idempotency_key: str | None = None,
        fingerprint: str = "",
        webhook: tuple[str, frozenset[str]] | None = None,
        terms: CallerTerms = DEFAULT_TERMS,
        priority: str = DEFAULT_PRIORITY,
    ) -> Deferred[Admission]:
        payload = self._encode(request)
        url, events = webhook or ("", frozenset())
        limit = self.caller_limit(terms)
        weight = min(max(1, terms.weight), MAX_WEIGHT)
        extras = (owner, idempotency_key or "", fingerprint, url, ",".join(sorted(events)),
                  priority, str(limit), str(weight))  # fmt: skip
        return self._admit(payload, task_id, extras, tries=8)

    def caller_limit(self, terms: CallerTerms = DEFAULT_TERMS) -> int:
        """A caller's limit of pending + running jobs (0 = only ``max_queue``)."""
        if terms.max_pending is not None and terms.max_pending > 0:
            return terms.max_pending
        return self._per_caller

    def _admit(
        self, payload: bytes, task_id: str, extras: tuple[str, ...], tries: int
    ) -> Deferred[Admission]:
        """One ``ADMIT`` under a fresh id; again (``tries`` in all) if the id is taken.
        Plain callbacks, no coroutine: this is every submit's path."""

        def decide(reply: list[Any]) -> Admission | Deferred[Admission]:
            status, depth, known = reply
            self._depth = depth
            if status == 1:
                return Admission(job_id)
            if status == 0:
                return Admission(None)
            if status == 2:
                return Admission(reply_text(known), replayed=True)
            if status == 3:
                return Admission(None, conflict=True)
            if status == 4:  # the caller's own limit (known: the limit)
                return Admission(None, over_quota=True, limit=int(reply_text(known)))
            if tries > 1:  # -1: the drawn id exists (96 random bits: practically never)
                return self._admit(payload, task_id, extras, tries - 1)
            raise RuntimeError("could not draw a free job id")

        job_id = new_job_id()
        keys = self._job(job_id)
        if extras[1]:  # the idempotency key
            keys += (idem_key(self._prefix, extras[0], extras[1]),)
        d = self._script("admit", self._max_queue, job_id, task_id, payload, *extras, keys=keys)
        return d.addCallback(decide)

    def cancel(self, job_id: str) -> Deferred[tuple[CancelOutcome, JobSnapshot | None]]:
        """Pending → cancelled (in Redis, at once); running → flagged and announced
        on the channel, so the replica that runs it stops it (:attr:`on_cancel`)."""

        def decode(reply: Any) -> tuple[CancelOutcome, JobSnapshot | None]:
            if not reply:
                return CancelOutcome.UNKNOWN, None
            outcome = CancelOutcome(reply_text(reply[0]))
            return outcome, decode_snapshot(job_id, reply[1:])

        d = self._script(
            "cancel", job_id, self._ttl_ms, self._max_completed, keys=self._job(job_id)
        )
        return d.addCallback(decode)

    def _extras(self, job_id: str) -> Deferred[list[str]]:
        return self._script("job_extras", job_id, keys=self._job(job_id)).addCallback(
            lambda reply: [reply_text(x) or "" for x in reply]
        )

    def cancel_requested(self, job_id: str) -> Deferred[bool]:
        return self._extras(job_id).addCallback(lambda extras: extras[2] == "1")

    def webhook_of(self, job_id: str) -> Deferred[tuple[str, frozenset[str]] | None]:
        def decode(extras: list[str]) -> tuple[str, frozenset[str]] | None:
            if not extras[0]:
                return None
            return extras[0], frozenset(e for e in extras[1].split(",") if e)

        return self._extras(job_id).addCallback(decode)

    def queue_view(self, owner: str | None = None) -> Deferred[QueueView]:
        """``GET /queue``: totals and one line per caller holding jobs (only
        ``owner``'s when given). A caller's oldest wait is looked for among the
        :data:`QUEUE_SCAN` oldest pending jobs of the model (0 beyond them)."""

        def decode(reply: list[Any]) -> QueueView:
            depth, pending, first, now = reply[:4]
            now = int(now)
            lines = []
            rest = reply[4:]
            for i in range(0, len(rest), 5):
                who, active, running, oldest, limit = rest[i : i + 5]
                since = reply_text(oldest)
                lines.append(
                    CallerLine(
                        reply_text(who), int(active) - int(running), int(running),
                        now - int(float(since)) if since else 0, int(limit),
                    )
                )  # fmt: skip
            if owner is not None and not lines:
                lines.append(CallerLine(owner, 0, 0, 0, self._per_caller))
            start = reply_text(first)
            oldest_ms = now - int(float(start)) if start else 0
            depth, pending = int(depth), int(pending)
            return QueueView(
                depth, pending, depth - pending, oldest_ms, self._max_queue, sorted(lines)
            )

        return self._script("queue", owner or "", QUEUE_SCAN).addCallback(decode)

    def list_jobs(
        self,
        *,
        owner: str | None,
        states: frozenset[JobState] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Deferred[JobPage]:
        before = parse_cursor(cursor)  # ValueError for a malformed cursor, at once
        names = ",".join(sorted(s.value for s in states)) if states else ""
        args = (
            owner or "", "0" if owner is None else "1", names, limit,
            "" if before is None else before,
        )  # fmt: skip

        def decode(reply: Any) -> JobPage:
            jobs = []
            for i in range(1, len(reply), 2):
                snap = decode_snapshot(reply_text(reply[i]) or "", reply[i + 1])
                if snap is not None:
                    jobs.append(snap)
            next_seq = reply_text(reply[0])
            return JobPage(jobs, f"c{next_seq}" if next_seq else None)

        return self._script("list", *args).addCallback(decode)

    def begin(self, job_id: str) -> None:
        raise NotImplementedError("the Redis store is pull-only: use claim_next")

    def claim_next(self) -> Deferred[Claim | None]:
        return self._script(
            "claim", self.owner, self._lease_ms, self._ttl_ms, self._max_completed
        ).addCallback(self._claimed)

    def _claimed(self, reply: Any) -> Claim | Deferred[Claim | None] | None:
        if not reply:
            return None
        self._report_ended(reply[0])
        if len(reply) == 1:  # no job to run (it ended flagged ones only)
            return None
        raw_id, payload, age_ms, attempt = reply[1:]
        job_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        self._held[job_id] = int(attempt)
        try:
            if not payload:
                raise ValueError("no request payload")
            request = self._decode(payload)
        except Exception as exc:
            # Unreadable (written by something else, or damaged): the job ends failed
            # here, once, and the next one is taken; retrying it elsewhere cannot help.
            log.error("job {job}: unreadable request ({e}); failing it", job=job_id, e=exc)
            ended = self.terminate(job_id, JobState.FAILED, error=f"unreadable job request: {exc}")
            ended.addCallback(
                lambda state: self._report_ended([job_id, state.value] if state else [])
            )
            ended.addErrback(lambda f: log.failure("failing job {job}", f, job=job_id))
            return self.claim_next()
        if self._early_cancels.pop(job_id, None) is not None:
            # Its cancel was announced before this reply arrived: stop it as soon as
            # the runner has taken the claim (the next reactor turn).
            self._reactor.callLater(0, self._cancel_held, job_id)
        return Claim(job_id, request, int(age_ms), int(attempt))

    def terminate(
        self, job_id: str, state: JobState, *, result: Any = None, error: str | None = None
    ) -> Deferred[JobState | None]:
        """The terminal transition (see :class:`JobStore`): the state the job ended
        in, or None. A job whose cancel was accepted ends ``cancelled`` even when
        ``state`` is ``done`` (another replica's cancel may land after the run
        returned and before this replica heard of it)."""
        if state not in TERMINAL_STATES:
            raise ValueError(f"not a terminal state: {state!r}")
        self._progress.forget(job_id)
        if job_id in self._handed_back:  # the run we stopped: the job is queued again
            self._handed_back.discard(job_id)
            return succeed(None)
        attempt = self._held.get(job_id)
        args = (
            job_id, state.value, result or b"", (error or "").encode("utf-8"),
            self.owner if attempt is not None else "", "" if attempt is None else attempt,
            self._ttl_ms, self._max_completed,
        )  # fmt: skip
        return Deferred.fromCoroutine(self._terminate(job_id, args))

    async def _terminate(self, job_id: str, args: tuple[Any, ...]) -> JobState | None:
        self._ending.add(job_id)
        try:
            return await self._terminate_once(job_id, args)
        finally:
            self._ending.discard(job_id)

    async def _terminate_once(self, job_id: str, args: tuple[Any, ...]) -> JobState | None:
        while True:
            try:
                reply = await self._script("terminate", *args, keys=self._job(job_id))
                break
            except StoreUnavailable:
                if self._stopped or job_id not in self._held:
                    raise
                # Keep the lease (maintain renews it once Redis is back) and retry:
                # a job that finished during an outage is not run again.
                await deferLater(self._reactor, RETRY_TERMINAL_S, lambda: None)
        self._held.pop(job_id, None)
        self._depth = int(reply[1])
        return JobState(reply_text(reply[2])) if reply[0] == 1 else None

    # -- progress -------------------------------------------------------------------

    def set_progress(self, job_id: str, step: int, total: int) -> None:
        """Any thread. Coalesced (:class:`ProgressWriter`): ≤ 5 writes a second per
        job plus the last step; each write reads the job's cancel flag back."""
        self._progress.report(job_id, step, total)

    def _write_progress(self, job_id: str, text: str) -> None:
        if job_id not in self._held:
            return
        keys = (job_key(self._prefix, job_id), follow_key(self._prefix, job_id))
        d = self._script("progress", job_id, self.owner, text, keys=keys)

        def flagged(reply: Any) -> None:
            if reply and int(reply[1]):
                self._cancel_held(job_id)  # a cancel whose message never came

        d.addCallbacks(flagged, lambda _f: None)  # progress is best effort

    def _refresh_follows(self) -> None:
        """Mark the jobs that event streams here follow (a ``p`` event per write)."""
        if not self.link.connected:
            return
        keys = [
            follow_key(self._prefix, name[: -len(EVENTS_SUFFIX)])
            for name in self._counters.names()
            if name.endswith(EVENTS_SUFFIX)
        ]
        if keys:
            self.link.script("follow", keys, (FOLLOW_TTL_MS,)).addErrback(lambda _f: None)

    # -- reads ----------------------------------------------------------------------

    def snapshot(self, job_id: str) -> Deferred[JobSnapshot | None]:
        ended = self._ended_views.get(job_id)
        if ended is not None:  # a terminal view is final: no need to read it again
            return succeed(ended)
        return self._script("snapshot", job_id, keys=self._job(job_id)).addCallback(
            lambda reply: decode_snapshot(job_id, reply)
        )

    def take_result(self, job_id: str) -> Deferred[ResultLookup]:
        return self._script("result", job_id, keys=self._job(job_id)).addCallback(decode_result)

    # -- upkeep ---------------------------------------------------------------------

    def maintain(self) -> Deferred[int]:
        """Renew this replica's leases (and read their cancel flags), re-queue or fail
        the jobs of lost replicas, time out overdue pending jobs, forget expired
        retention entries. A held job that was cancelled, or is no longer this
        replica's (its lease expired while the link was down: another replica ended
        or re-runs it), is stopped here (``on_cancel``): its result would be refused."""
        overdue = f"job exceeded async_timeout ({self._budget_ms} ms) while waiting for a worker"
        reclaim = self._reactor.seconds() >= self._reclaim_from
        attempts = self._max_attempts if reclaim else 0  # 0: renew only
        held = list(self._held)
        d = self._script(
            "maintain", self.owner, self._lease_ms, attempts, self._ttl_ms,
            self._max_completed, self._budget_ms, overdue, *held,
            keys=tuple(job_key(self._prefix, j) for j in held),
        )  # fmt: skip

        def done(reply: Any) -> int:
            _renewed, requeued, lost, timed_out, forgotten, depth = (int(x) for x in reply[:6])
            self._depth = depth
            if requeued or lost:
                log.warn(
                    "re-queued {n} job(s) of a lost replica; {m} ended (cancelled, or "
                    "failed after {a} attempt(s))", n=requeued, m=lost, a=self._max_attempts,
                )  # fmt: skip
            for raw in reply[6] if len(reply) > 6 else ():
                self._cancel_held(reply_text(raw) or "")
            self._report_ended(reply[7] if len(reply) > 7 else [])
            if self.on_queued is not None:
                self.on_queued()
            return lost + timed_out + forgotten

        return d.addCallback(done)

    def orphaned_at_shutdown(self) -> list[str]:
        return []  # jobs outlive a replica: pending ones stay queued for the others

    def hand_back(self, job_id: str) -> Deferred[bool]:
        """Re-queue a held job; whether or not Redis answers, this replica stops
        holding it (no more lease renewals: a failed hand-back leaves the job to
        expire and be re-run elsewhere, not running until this process exits)."""
        if job_id not in self._held:
            return succeed(False)
        self._handed_back.add(job_id)
        self._progress.forget(job_id)
        d = self._script("hand_back", job_id, self.owner, keys=self._job(job_id))

        def released(result: Any) -> Any:
            self._held.pop(job_id, None)
            return result

        return d.addBoth(released).addCallback(lambda reply: int(reply) == 1)

    # -- events ---------------------------------------------------------------------

    def _report_ended(self, ended: list[Any]) -> None:
        """``on_ended`` for each ``id, state`` pair a script reported ending (a
        failing callback is logged: the others are still reported)."""
        if self.on_ended is None:
            return
        for i in range(0, len(ended) - 1, 2):
            job_id = reply_text(ended[i]) or ""
            try:
                self.on_ended(job_id, JobState(reply_text(ended[i + 1])))
            except Exception:
                log.failure("reporting the end of job {job}", job=job_id)

    def _cancel_held(self, job_id: str) -> None:
        """A held job's cancel was accepted: the runtime stops its run (repeatable;
        not once its end is being written)."""
        if job_id in self._held and job_id not in self._ending and self.on_cancel is not None:
            self.on_cancel(job_id)

    def _on_event(self, message: bytes) -> None:
        kind, _, raw = message.partition(b" ")
        if kind == b"t":
            job_bytes, _, view = raw.partition(b" ")
            job = job_bytes.decode("utf-8", "replace")
            ended = _terminal_view(job, view) if view else None
            if ended is not None:
                self._ended_views[job] = ended
            try:
                self._counters.count_by_name(job, None)
                if self.on_change is not None:
                    self.on_change(job)
            finally:
                self._ended_views.pop(job, None)
            return
        job = raw.decode("utf-8", "replace")
        if kind == b"q" and self.on_queued is not None:
            self.on_queued()
        elif kind == b"c":
            if job in self._held:
                self._cancel_held(job)
            else:
                self._remember_cancel(job)
        elif kind == b"p" and self.on_change is not None:
            self.on_change(job)

    def _remember_cancel(self, job_id: str) -> None:
        now = self._reactor.seconds()
        early = self._early_cancels
        early[job_id] = now
        early.move_to_end(job_id)
        while early and (
            len(early) > EARLY_CANCELS or next(iter(early.values())) < now - EARLY_CANCEL_S
        ):
            early.popitem(last=False)

    def _reconnected(self) -> None:
        """(Re)connected: renew this replica's leases now, reclaim others' later."""
        self._reclaim_from = self._reactor.seconds() + self._lease_ms / 1000.0
        if self.upkeep:
            self.maintain().addErrback(lambda _f: None)

    def _resync_waiters(self) -> None:
        """After (re)subscribing, re-read what a deaf subscriber may have missed:
        the waited-for jobs that are terminal now, the held jobs' cancel flags (one
        lease renewal), and the queue. Reads that fail (the command connection is
        down, or goes down meanwhile) are done again once it is back."""
        if self._resync_pending:
            return
        self._resync_pending = True
        self.link.when_connected().addCallback(lambda _: self._resync())

    def _resync(self) -> None:
        self._resync_pending = False
        reads = []
        for job_id in self._counters.names():
            d = self.snapshot(job_id)

            def wake(snap: JobSnapshot | None, job_id: str = job_id) -> None:
                if snap is None or snap.terminal:
                    self._counters.count_by_name(job_id, None)

            reads.append(d.addCallback(wake))
        if self._held:
            reads.append(self.maintain())
        if self.on_queued is not None:
            self.on_queued()

        def again(failure: Any) -> None:
            failure.trap(StoreUnavailable)
            if not self._stopped:
                self._resync_waiters()

        for d in reads:
            d.addErrback(again)
            d.addErrback(lambda _f: None)


def _terminal_view(job_id: str, view: bytes) -> JobSnapshot | None:
    """The snapshot a terminal event carries (``SNAPSHOT``'s fields as JSON, ``false``
    for a missing field), or None when it is not one: the waiters then read the job."""
    try:
        fields = json.loads(view)
        if not isinstance(fields, list):
            return None
        snap = decode_snapshot(job_id, [None if f is False else f for f in fields])
    except (ValueError, TypeError, AttributeError):
        return None
    return snap if snap is not None and snap.terminal else None
