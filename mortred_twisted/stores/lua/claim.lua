-- CLAIM. KEYS: queue pending leases depth done uses holders done_owner index fair
-- band_low band_normal band_high (the jobs' hashes are named from the prefix)
-- ARGV: owner, lease_ms, ttl_ms, max_completed -> {ended, job_id, request, age_ms,
-- attempt} or {ended} (no job to run; false when it ended none either); a queued job
-- whose cancel was accepted (its replica handed it back after the request) ends
-- cancelled here instead of running, as a cancelled pending job, and is listed in
-- ended (id, state, id, state, ...).
-- The next job in the fair order (jobs/fair_queue.py), in one step for every
-- replica: the non-empty band with the smallest pass (ties: the higher band), in it
-- the smallest start tag (ties: the earlier admission); then that band's virtual
-- time and pass move on.
for _ = 1, 64 do
  local best, pass = nil, nil
  for _, band in ipairs(BANDS) do
    if redis.call('ZCARD', K['band_' .. band]) > 0 then
      local p = fget('p:' .. band)
      if not best or p < pass or (p == pass and BAND_RANK[band] > BAND_RANK[best]) then
        best, pass = band, p
      end
    end
  end
  if not best then break end
  local bkey = K['band_' .. best]
  local head = redis.call('ZRANGE', bkey, 0, 0, 'WITHSCORES')
  local member, tag = head[1], head[2]
  local id = member_id(member)
  local key = P .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'request', 'created', 'attempt', 'cancel')
  if f[1] ~= 'pending' then
    redis.call('ZREM', bkey, member)  -- not a pending job (a stale entry): drop it
  elseif f[5] then
    -- its cancel was accepted while it ran (then it was handed back): it ends
    -- cancelled as a pending job does, and the order does not move on
    terminate(id, 'cancelled', false, 'cancelled by request', tonumber(ARGV[3]),
              tonumber(ARGV[4]))
  else
    redis.call('ZREM', bkey, member)
    if tonumber(tag) > fget('v:' .. best) then redis.call('HSET', K.fair, 'v:' .. best, tag) end
    if pass > fget('gp') then redis.call('HSET', K.fair, 'gp', num(pass)) end
    redis.call('HSET', K.fair, 'p:' .. best, num(pass + BAND_STRIDE[best]))
    local now = now_ms()
    redis.call('HSET', key, 'state', 'running', 'owner', ARGV[1], 'started', now)
    redis.call('HINCRBY', K.fair, 'r:' .. (redis.call('HGET', key, 'principal') or ''), 1)
    redis.call('ZREM', K.pending, id)
    redis.call('ZADD', K.leases, now + tonumber(ARGV[2]), id)
    return {ENDED, id, f[2] or '', now - tonumber(f[3]), tonumber(f[4])}
  end
end
if #ENDED == 0 then return false end
return {ENDED}
