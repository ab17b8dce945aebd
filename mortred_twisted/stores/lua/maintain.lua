-- MAINTAIN. KEYS: leases pending queue depth done uses holders done_owner index sweep,
-- fair keys, then the hash of
-- every job this replica runs (in ARGV's order)
-- ARGV: owner, lease_ms, max_attempts (0: renew only), ttl_ms, max_completed,
-- budget_ms (0 none), overdue error text, then the ids this replica runs.
-- -> {renewed, requeued, failed (lost), timed out, forgotten, depth, {held ids to stop:
-- their cancel was requested, or they are no longer running on this replica (its
-- lease expired while it was cut off: the job ended or runs elsewhere)}, {the jobs
-- it ended: id, state, id, state, ...}}
local owner, lease = ARGV[1], tonumber(ARGV[2])
local max_attempts, ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local budget = tonumber(ARGV[6])
local now = now_ms()
local renewed, requeued, lost, overdue, forgotten = 0, 0, 0, 0, 0
local flagged = {}
for i = 8, #ARGV do
  local f = redis.call('HMGET', P .. 'job:' .. ARGV[i], 'state', 'owner', 'cancel')
  if f[1] == 'running' and f[2] == owner then
    redis.call('ZADD', K.leases, 'XX', now + lease, ARGV[i])
    renewed = renewed + 1
    if f[3] then table.insert(flagged, ARGV[i]) end
  else
    table.insert(flagged, ARGV[i])
  end
end
-- max_attempts 0: renew only (this replica has just reconnected; the others have
-- not had a chance to renew theirs yet)
local expired = {}
if max_attempts > 0 then
  expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now, 'LIMIT', 0, 100)
end
for _, id in ipairs(expired) do
  local key = P .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'attempt', 'cancel')
  redis.call('ZREM', K.leases, id)
  if f[1] == 'running' then
    local attempt = tonumber(f[2] or '1')
    if f[3] then
      -- its cancel was accepted: it ends cancelled, whatever attempts are left
      terminate(id, 'cancelled', false, 'cancelled by request', ttl, cap)
      lost = lost + 1
    elseif attempt >= max_attempts then
      terminate(id, 'failed', false, 'interrupted: replica lost', ttl, cap)
      lost = lost + 1
    else
      requeue(id, key, attempt + 1)
      requeued = requeued + 1
    end
  end
end
if budget > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.pending, '-inf', now - budget,
                                 'LIMIT', 0, 100)) do
    local key = P .. 'job:' .. id
    if redis.call('HGET', key, 'state') == 'pending' then
      terminate(id, 'timeout', false, ARGV[7], ttl, cap)
      overdue = overdue + 1
    else
      redis.call('ZREM', K.pending, id)
    end
  end
end
-- Forget entries whose hash expired (TTL), at most SWEEP_BATCH per set per call,
-- resuming where the last call stopped, so a script never walks a huge set at once.
for _, name in ipairs({'done', 'index'}) do
  local zset = K[name]
  local at = tonumber(redis.call('HGET', K.sweep, name) or '0')
  local batch = redis.call('ZRANGE', zset, at, at + SWEEP_BATCH - 1)
  local kept = 0
  for _, id in ipairs(batch) do
    if redis.call('EXISTS', P .. 'job:' .. id) == 0 then
      if name == 'done' then
        unretain(id)
        forgotten = forgotten + 1
      else
        redis.call('ZREM', zset, id)
      end
    else
      kept = kept + 1
    end
  end
  if #batch < SWEEP_BATCH then at = 0 else at = at + kept end
  redis.call('HSET', K.sweep, name, at)
end
return {renewed, requeued, lost, overdue, forgotten, depth(), flagged, ENDED}
