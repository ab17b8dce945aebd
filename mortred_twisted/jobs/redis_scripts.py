"""The Redis data model of the shared job store, and its Lua scripts (pure).

Keys of one model id (all under one hash tag, so they share a cluster slot)::

    mortred:{<id>}:job:<job_id>  HASH   state, task, created, started (ms of the
                                        Redis clock), completed (ms with µs),
                                        attempt, owner (the replica running it),
                                        progress "s/t", error, request (until
                                        terminal), result; principal (the caller),
                                        seq, cancel, idem, webhook, hook_events
    mortred:{<id>}:depth         STRING admitted non-terminal jobs (invariant 3)
    mortred:{<id>}:queue         STREAM one entry {job: <id>} per (re)queued job;
                                        consumer group "workers"
    mortred:{<id>}:pending       ZSET   pending job -> admission ms (overdue budget)
    mortred:{<id>}:leases        ZSET   running job -> lease deadline ms
    mortred:{<id>}:done          ZSET   terminal job -> last use (LRU; a use counter)
    mortred:{<id>}:uses          STRING the use counter (INCR per terminal/use)
    mortred:{<id>}:sweep         HASH   where MAINTAIN's retention sweep resumes
    mortred:{<id>}:index         ZSET   every job -> admission sequence (listings)
    mortred:{<id>}:seq           STRING the admission sequence (INCR per job)
    mortred:{<id>}:idem:<p>:<k>  STRING "<job_id> <fingerprint>": the Idempotency-Key
                                        <k> of principal <p>, for as long as its job
                                        is retained (same TTL, deleted with it)
    mortred:{<id>}:events        pub/sub channel: "t <job_id>" terminal,
                                        "q <job_id>" queued, "c <job_id>" cancel
                                        requested (running), "p <job_id>" progress

Every multi-key transition is one script, so it is atomic across replicas:
admission check + enqueue (``ADMIT``), claim (``CLAIM``: read the stream, ack and
delete the entry, pending → running under a lease), the terminal transition
(``TERMINATE``, which frees the request, decrements the depth once, enters
retention and publishes), upkeep (``MAINTAIN``: renew this replica's leases,
re-queue the jobs of replicas whose lease expired — or fail them after
``max_attempts`` — time out pending jobs past their budget, forget expired
retention entries) and ``HAND_BACK``. Times come from Redis ``TIME``, so the
replicas' clocks never matter. Terminal jobs get ``PEXPIRE`` (the TTL) and are
evicted oldest-use-first beyond ``max_completed``; a non-terminal job is never in
``done`` and never expires.

The scripts receive the key prefix as ``KEYS[1]`` and derive the other names.
"""

from __future__ import annotations

from mortred_twisted.jobs.ledger import JobSnapshot, ResultLookup
from mortred_twisted.jobs.states import JobState

GROUP = "workers"
LOST_REPLICA_ERROR = "interrupted: replica lost"


def key_prefix(model_id: str) -> str:
    """``mortred:{<id>}:`` — the hash tag keeps one model's keys in one slot."""
    return f"mortred:{{{model_id}}}:"


_PRELUDE = """
local P = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The same clock as text with microseconds ("<ms>.<µs>"): Lua's number-to-string
-- conversion keeps 14 digits, which would round today's ms to 10 ms.
local function now_ms_text()
  local t = redis.call('TIME')
  local us = string.format('%06d', tonumber(t[2]))
  return t[1] .. string.sub(us, 1, 3) .. '.' .. string.sub(us, 4)
end
local function forget(id)
  local idem = redis.call('HGET', P .. 'job:' .. id, 'idem')
  if idem then redis.call('DEL', idem) end
  redis.call('DEL', P .. 'job:' .. id)
  redis.call('ZREM', P .. 'done', id)
  redis.call('ZREM', P .. 'index', id)
end
local function use_mark()
  return redis.call('INCR', P .. 'uses')
end
local function depth()
  return tonumber(redis.call('GET', P .. 'depth') or '0')
end
-- A job's status fields: {state, task, created, started, completed, error, progress,
-- attempt, now, cancel, queue position (pending: 1 = next; else 0)} or false.
local function view(id)
  local f = redis.call('HMGET', P .. 'job:' .. id, 'state', 'task', 'created', 'started',
                       'completed', 'error', 'progress', 'attempt', 'cancel')
  if not f[1] then return false end
  local position = 0
  if f[1] == 'pending' then
    -- pending is scored by admission ms: count the earlier ones, then break ties
    -- within the same millisecond by admission sequence
    local created = f[3]
    position = redis.call('ZCOUNT', P .. 'pending', '-inf', '(' .. created) + 1
    local mine = tonumber(redis.call('HGET', P .. 'job:' .. id, 'seq') or '0')
    for _, other in ipairs(redis.call('ZRANGEBYSCORE', P .. 'pending', created, created)) do
      if other ~= id then
        local seq = tonumber(redis.call('HGET', P .. 'job:' .. other, 'seq') or '0')
        if seq < mine then position = position + 1 end
      end
    end
  end
  return {f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], now_ms(), f[9] or '', position}
end
-- The one non-terminal -> terminal transition (callers check the state first).
local function terminate(id, state, result, err, ttl_ms, max_completed)
  local key = P .. 'job:' .. id
  redis.call('HSET', key, 'state', state, 'completed', now_ms_text())
  if result then redis.call('HSET', key, 'result', result) end
  if err then redis.call('HSET', key, 'error', err) end
  redis.call('HDEL', key, 'request', 'owner')
  redis.call('DECR', P .. 'depth')
  redis.call('ZREM', P .. 'pending', id)
  redis.call('ZREM', P .. 'leases', id)
  redis.call('ZADD', P .. 'done', use_mark(), id)
  if ttl_ms > 0 then
    redis.call('PEXPIRE', key, ttl_ms)
    local idem = redis.call('HGET', key, 'idem')
    if idem then redis.call('PEXPIRE', idem, ttl_ms) end
  end
  local over = redis.call('ZCARD', P .. 'done') - max_completed
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', P .. 'done', 0, over - 1)) do forget(old) end
  end
  -- The event carries the job's terminal view, so a replica whose waiters it wakes
  -- answers them without reading the job again (one round trip less per wake-up).
  local v = view(id)
  if v then
    redis.call('PUBLISH', P .. 'events', 't ' .. id .. ' ' .. cjson.encode(v))
  else
    redis.call('PUBLISH', P .. 'events', 't ' .. id)
  end
end
local function requeue(id, key, attempt)
  redis.call('HSET', key, 'state', 'pending', 'attempt', attempt)
  redis.call('HDEL', key, 'owner', 'started', 'progress')
  redis.call('ZREM', P .. 'leases', id)
  redis.call('ZADD', P .. 'pending', redis.call('HGET', key, 'created'), id)
  redis.call('XADD', P .. 'queue', '*', 'job', id)
  redis.call('PUBLISH', P .. 'events', 'q ' .. id)
end
"""

#: ARGV: max_queue, job_id, task_id, request, principal, idempotency key ('' none),
#: fingerprint, webhook url ('' none), webhook events (comma list)
#: -> {admitted (1; 0 full; -1 id taken; 2 replayed; 3 key conflict), depth, job id}
ADMIT = (
    _PRELUDE
    + """
local d = depth()
local idem = false
if ARGV[6] ~= '' then
  idem = P .. 'idem:' .. ARGV[5] .. ':' .. ARGV[6]
  local known = redis.call('GET', idem)
  if known then
    local sep = string.find(known, ' ', 1, true)
    local job, fp = string.sub(known, 1, sep - 1), string.sub(known, sep + 1)
    if redis.call('EXISTS', P .. 'job:' .. job) == 1 then
      if fp ~= ARGV[7] then return {3, d, ''} end
      if redis.call('HGET', P .. 'job:' .. job, 'completed') then
        redis.call('ZADD', P .. 'done', 'XX', use_mark(), job)
      end
      return {2, d, job}
    end
    redis.call('DEL', idem)  -- its job is gone (retention): the key is free again
  end
end
if d >= tonumber(ARGV[1]) then return {0, d, ''} end
local id = ARGV[2]
local key = P .. 'job:' .. id
if redis.call('EXISTS', key) == 1 then return {-1, d, ''} end
local now = now_ms()
local seq = redis.call('INCR', P .. 'seq')
redis.call('HSET', key, 'state', 'pending', 'task', ARGV[3], 'created', now,
           'attempt', 1, 'request', ARGV[4], 'principal', ARGV[5], 'seq', seq)
if idem then
  redis.call('SET', idem, id .. ' ' .. ARGV[7])
  redis.call('HSET', key, 'idem', idem)
end
if ARGV[8] ~= '' then redis.call('HSET', key, 'webhook', ARGV[8], 'hook_events', ARGV[9]) end
redis.call('INCR', P .. 'depth')
redis.call('ZADD', P .. 'pending', now, id)
redis.call('ZADD', P .. 'index', seq, id)
redis.call('XADD', P .. 'queue', '*', 'job', id)
redis.call('PUBLISH', P .. 'events', 'q ' .. id)
return {1, d + 1, id}
"""
)

#: ARGV: owner, lease_ms, ttl_ms, max_completed -> false, or {job_id, request, age_ms,
#: attempt}; a queued job that was asked to stop (its replica was lost) ends cancelled
CLAIM = (
    _PRELUDE
    + """
for _ = 1, 64 do
  local got = redis.call('XREADGROUP', 'GROUP', 'workers', ARGV[1], 'COUNT', 1,
                         'STREAMS', P .. 'queue', '>')
  if not got then return false end
  local entry = got[1][2][1]
  redis.call('XACK', P .. 'queue', 'workers', entry[1])
  redis.call('XDEL', P .. 'queue', entry[1])
  local id = entry[2][2]
  local key = P .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'request', 'created', 'attempt', 'cancel')
  if f[1] == 'pending' and f[5] then
    -- asked to stop while it ran on a replica that was then lost: it ends here
    terminate(id, 'cancelled', false, 'cancelled by request', tonumber(ARGV[3]),
              tonumber(ARGV[4]))
  elseif f[1] == 'pending' then
    local now = now_ms()
    redis.call('HSET', key, 'state', 'running', 'owner', ARGV[1], 'started', now)
    redis.call('ZREM', P .. 'pending', id)
    redis.call('ZADD', P .. 'leases', now + tonumber(ARGV[2]), id)
    return {id, f[2] or '', now - tonumber(f[3]), tonumber(f[4])}
  end
end
return false
"""
)

#: ARGV: job_id, state, result ('' none), error ('' none), owner ('' any),
#: attempt ('' any), ttl_ms, max_completed -> {ended 1/0, depth}
TERMINATE = (
    _PRELUDE
    + """
local id = ARGV[1]
local key = P .. 'job:' .. id
local f = redis.call('HMGET', key, 'state', 'owner', 'attempt')
local mine = ARGV[5] == '' or (f[2] == ARGV[5] and (ARGV[6] == '' or f[3] == ARGV[6]))
if f[1] == 'pending' or (f[1] == 'running' and mine) then
  local result = ARGV[3] ~= '' and ARGV[3] or false
  local err = ARGV[4] ~= '' and ARGV[4] or false
  terminate(id, ARGV[2], result, err, tonumber(ARGV[7]), tonumber(ARGV[8]))
  return {1, depth()}
end
return {0, depth()}
"""
)

#: ARGV: job_id -> false, or {state, task, created, started, completed, error,
#: progress, attempt, now}; refreshes the LRU position of a terminal job.
SNAPSHOT = (
    _PRELUDE
    + """
if not view(ARGV[1]) then return false end
if redis.call('HEXISTS', P .. 'job:' .. ARGV[1], 'completed') == 1 then
  redis.call('ZADD', P .. 'done', 'XX', use_mark(), ARGV[1])
end
return view(ARGV[1])
"""
)

#: ARGV: job_id -> false, or {state, task, result}; refreshes the LRU position.
RESULT = (
    _PRELUDE
    + """
local key = P .. 'job:' .. ARGV[1]
local f = redis.call('HMGET', key, 'state', 'task', 'result', 'completed')
if not f[1] then return false end
if f[4] then redis.call('ZADD', P .. 'done', 'XX', use_mark(), ARGV[1]) end
if f[1] ~= 'done' then return {f[1], f[2], false} end
return {f[1], f[2], f[3]}
"""
)

#: ARGV: job_id, owner, "step/total" -> 1 if recorded
PROGRESS = (
    _PRELUDE
    + """
local key = P .. 'job:' .. ARGV[1]
local f = redis.call('HMGET', key, 'state', 'owner')
if f[1] == 'running' and f[2] == ARGV[2] then
  redis.call('HSET', key, 'progress', ARGV[3])
  redis.call('PUBLISH', P .. 'events', 'p ' .. ARGV[1])
  return 1
end
return 0
"""
)

#: ARGV: job_id, owner -> 1 if the job went back to the queue (same attempt)
HAND_BACK = (
    _PRELUDE
    + """
local id = ARGV[1]
local key = P .. 'job:' .. id
local f = redis.call('HMGET', key, 'state', 'owner', 'attempt')
if f[1] == 'running' and f[2] == ARGV[2] then
  requeue(id, key, f[3])
  return 1
end
return 0
"""
)

#: ARGV: owner, lease_ms, max_attempts (0: renew only), ttl_ms, max_completed, budget_ms (0 none),
#: overdue error text, then the ids this replica runs.
#: -> {renewed, requeued, failed (lost), timed out, forgotten, depth}
#: Retention entries MAINTAIN checks per set and call (see its last loop).
SWEEP_BATCH = 256

MAINTAIN = (
    _PRELUDE
    + f"local SWEEP_BATCH = {SWEEP_BATCH}\n"
    + """
local owner, lease = ARGV[1], tonumber(ARGV[2])
local max_attempts, ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local now = now_ms()
local renewed, requeued, lost, overdue, forgotten = 0, 0, 0, 0, 0
for i = 8, #ARGV do
  local f = redis.call('HMGET', P .. 'job:' .. ARGV[i], 'state', 'owner')
  if f[1] == 'running' and f[2] == owner then
    redis.call('ZADD', P .. 'leases', 'XX', now + lease, ARGV[i])
    renewed = renewed + 1
  end
end
-- max_attempts 0: renew only (this replica has just reconnected; the others have
-- not had a chance to renew theirs yet)
local expired = {}
if max_attempts > 0 then
  expired = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', now, 'LIMIT', 0, 100)
end
for _, id in ipairs(expired) do
  local key = P .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'attempt')
  redis.call('ZREM', P .. 'leases', id)
  if f[1] == 'running' then
    local attempt = tonumber(f[2] or '1')
    if attempt >= max_attempts then
      terminate(id, 'failed', false, 'interrupted: replica lost', ttl, cap)
      lost = lost + 1
    else
      requeue(id, key, attempt + 1)
      requeued = requeued + 1
    end
  end
end
if budget > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'pending', '-inf', now - budget,
                                 'LIMIT', 0, 100)) do
    local key = P .. 'job:' .. id
    if redis.call('HGET', key, 'state') == 'pending' then
      terminate(id, 'timeout', false, ARGV[7], ttl, cap)
      overdue = overdue + 1
    else
      redis.call('ZREM', P .. 'pending', id)
    end
  end
end
-- Forget entries whose hash expired (TTL), at most SWEEP_BATCH per set per call,
-- resuming where the last call stopped, so a script never walks a huge set at once.
for _, zset in ipairs({'done', 'index'}) do
  local at = tonumber(redis.call('HGET', P .. 'sweep', zset) or '0')
  local batch = redis.call('ZRANGE', P .. zset, at, at + SWEEP_BATCH - 1)
  local kept = 0
  for _, id in ipairs(batch) do
    if redis.call('EXISTS', P .. 'job:' .. id) == 0 then
      redis.call('ZREM', P .. zset, id)
      if zset == 'done' then forgotten = forgotten + 1 end
    else
      kept = kept + 1
    end
  end
  if #batch < SWEEP_BATCH then at = 0 else at = at + kept end
  redis.call('HSET', P .. 'sweep', zset, at)
end
return {renewed, requeued, lost, overdue, forgotten, depth()}
"""
)

#: ARGV: job_id, ttl_ms, max_completed -> {outcome, view...} with outcome 'cancelled'
#: (was pending), 'requested' (running: flagged and announced), 'finished'; false unknown
CANCEL = (
    _PRELUDE
    + """
local id = ARGV[1]
local key = P .. 'job:' .. id
local state = redis.call('HGET', key, 'state')
if not state then return false end
local outcome = 'finished'
if state == 'pending' then
  terminate(id, 'cancelled', false, 'cancelled by request', tonumber(ARGV[2]),
            tonumber(ARGV[3]))
  outcome = 'cancelled'
elseif state == 'running' then
  redis.call('HSET', key, 'cancel', '1')
  redis.call('PUBLISH', P .. 'events', 'c ' .. id)
  outcome = 'requested'
elseif redis.call('HEXISTS', key, 'completed') == 1 then
  redis.call('ZADD', P .. 'done', 'XX', use_mark(), id)
end
local v = view(id)
if not v then return false end  -- retention removed it at once (max_completed 0)
table.insert(v, 1, outcome)
return v
"""
)

#: ARGV: job_id -> {webhook url or '', events, cancel flag or ''}
JOB_EXTRAS = """
local f = redis.call('HMGET', KEYS[1] .. 'job:' .. ARGV[1], 'webhook', 'hook_events', 'cancel')
return {f[1] or '', f[2] or '', f[3] or ''}
"""

#: ARGV: principal ('' with filter 0), filter (1 = only that principal's jobs), states
#: (comma list, '' any), limit, before (sequence; '' = newest) ->
#: {next cursor sequence or '', id1, view1..., id2, view2...} newest first
LIST = (
    _PRELUDE
    + """
local only, states, limit = ARGV[2] == '1', {}, tonumber(ARGV[4])
for name in string.gmatch(ARGV[3], '[^,]+') do states[name] = true end
local any_state = ARGV[3] == ''
local top = ARGV[5] == '' and '+inf' or ('(' .. ARGV[5])
local out, found, scanned, last_seq = {''}, 0, 0, ''
while scanned < 20000 do
  local batch = redis.call('ZREVRANGEBYSCORE', P .. 'index', top, '-inf', 'WITHSCORES',
                           'LIMIT', 0, 200)
  if #batch == 0 then break end
  for i = 1, #batch, 2 do
    local id, seq = batch[i], batch[i + 1]
    scanned = scanned + 1
    top = '(' .. seq
    local f = redis.call('HMGET', P .. 'job:' .. id, 'state', 'principal')
    if f[1] and (any_state or states[f[1]]) and (not only or f[2] == ARGV[1]) then
      if found == limit then
        out[1] = last_seq
        return out
      end
      table.insert(out, id)
      table.insert(out, view(id))
      found = found + 1
      last_seq = seq
    end
  end
end
return out
"""
)

SCRIPTS: dict[str, str] = {
    "admit": ADMIT,
    "claim": CLAIM,
    "terminate": TERMINATE,
    "snapshot": SNAPSHOT,
    "result": RESULT,
    "progress": PROGRESS,
    "hand_back": HAND_BACK,
    "maintain": MAINTAIN,
    "cancel": CANCEL,
    "job_extras": JOB_EXTRAS,
    "list": LIST,
}


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
    )


def decode_result(reply: list[object] | None) -> ResultLookup:
    """The :class:`ResultLookup` of a ``RESULT`` reply."""
    if not reply:
        return ResultLookup(found=False)
    state, task, result = reply
    return ResultLookup(
        found=True,
        state=JobState(reply_text(state)),  # type: ignore[arg-type]
        result=result,
        task_id=reply_text(task) or "",  # type: ignore[arg-type]
    )
