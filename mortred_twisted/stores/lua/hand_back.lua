-- HAND_BACK. KEYS: leases pending queue, job
-- ARGV: job_id, owner -> 1 if the job went back to the queue (same attempt)
local f = redis.call('HMGET', K.job, 'state', 'owner', 'attempt')
if f[1] == 'running' and f[2] == ARGV[2] then
  requeue(ARGV[1], K.job, f[3])
  return 1
end
return 0
