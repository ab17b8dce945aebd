-- SNAPSHOT. KEYS: pending done uses, job
-- ARGV: job_id -> false, or view(); refreshes the LRU position of a terminal job.
if not view(ARGV[1]) then return false end
if redis.call('HEXISTS', K.job, 'completed') == 1 then
  redis.call('ZADD', K.done, 'XX', use_mark(), ARGV[1])
end
return view(ARGV[1])
