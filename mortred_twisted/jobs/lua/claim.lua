-- CLAIM. KEYS: queue pending leases depth done uses index (the job comes from the
-- stream: its hash is named from the prefix)
-- ARGV: owner, lease_ms, ttl_ms, max_completed -> false, or {job_id, request, age_ms,
-- attempt}; a queued job whose cancel was accepted (its replica was lost after the
-- request) ends cancelled here instead of running.
for _ = 1, 64 do
  local got = redis.call('XREADGROUP', 'GROUP', 'workers', ARGV[1], 'COUNT', 1,
                         'STREAMS', K.queue, '>')
  if not got then return false end
  local entry = got[1][2][1]
  redis.call('XACK', K.queue, 'workers', entry[1])
  redis.call('XDEL', K.queue, entry[1])
  local id = entry[2][2]
  local key = P .. 'job:' .. id
  local f = redis.call('HMGET', key, 'state', 'request', 'created', 'attempt', 'cancel')
  if f[1] == 'pending' and f[5] then
    terminate(id, 'cancelled', false, 'cancelled by request', tonumber(ARGV[3]),
              tonumber(ARGV[4]))
  elseif f[1] == 'pending' then
    local now = now_ms()
    redis.call('HSET', key, 'state', 'running', 'owner', ARGV[1], 'started', now)
    redis.call('ZREM', K.pending, id)
    redis.call('ZADD', K.leases, now + tonumber(ARGV[2]), id)
    return {id, f[2] or '', now - tonumber(f[3]), tonumber(f[4])}
  end
end
return false
