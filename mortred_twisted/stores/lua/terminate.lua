-- TERMINATE. KEYS: depth pending leases done uses holders done_owner index, fair keys,
-- job
-- ARGV: job_id, state, result ('' none), error ('' none), owner ('' any),
-- attempt ('' any), ttl_ms, max_completed -> {ended 1/0, depth, the state it ended in}
-- A job whose cancel was accepted never ends 'done': a run that finished before it
-- saw the flag ends 'cancelled' (its result is dropped).
local id = ARGV[1]
local key = K.job
local f = redis.call('HMGET', key, 'state', 'owner', 'attempt', 'cancel')
local mine = ARGV[5] == '' or (f[2] == ARGV[5] and (ARGV[6] == '' or f[3] == ARGV[6]))
if f[1] == 'pending' or (f[1] == 'running' and mine) then
  local state = ARGV[2]
  local result = ARGV[3] ~= '' and ARGV[3] or false
  local err = ARGV[4] ~= '' and ARGV[4] or false
  if state == 'done' and f[4] then
    state, result, err = 'cancelled', false, 'cancelled by request (the run finished first)'
  end
  terminate(id, state, result, err, tonumber(ARGV[7]), tonumber(ARGV[8]))
  return {1, depth(), state}
end
return {0, depth(), f[1] or ''}
