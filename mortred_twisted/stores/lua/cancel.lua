-- CANCEL. KEYS: depth pending leases done uses holders done_owner index, fair keys, job
-- ARGV: job_id, ttl_ms, max_completed -> {outcome, view...} with outcome 'cancelled'
-- (was pending), 'requested' (running: flagged in the job's hash, then announced),
-- 'finished'; false unknown. The flag is the durable fact (read at claim, at every
-- lease renewal and progress write); the announcement is only the fast path.
local id = ARGV[1]
local key = K.job
local state = redis.call('HGET', key, 'state')
if not state then return false end
local outcome = 'finished'
if state == 'pending' then
  terminate(id, 'cancelled', false, 'cancelled by request', tonumber(ARGV[2]),
            tonumber(ARGV[3]))
  outcome = 'cancelled'
elseif state == 'running' then
  redis.call('HSET', key, 'cancel', '1')
  redis.call('PUBLISH', CHANNEL, 'c ' .. id)
  outcome = 'requested'
else
  touch(id)
end
local v = view(id)
if not v then return false end  -- retention removed it at once (max_completed 0)
table.insert(v, 1, outcome)
return v
