-- PROGRESS. KEYS: job, follow (set while an event stream on some replica follows it)
-- ARGV: job_id, owner, "step/total" -> {recorded 1/0, cancel requested 1/0}
-- The reply carries the job's cancel flag: the replica reads it at every (coalesced)
-- progress write, so a cancel whose announcement was lost still stops the run.
local f = redis.call('HMGET', K.job, 'state', 'owner', 'cancel')
local flagged = f[3] and 1 or 0
if f[1] == 'running' and f[2] == ARGV[2] then
  redis.call('HSET', K.job, 'progress', ARGV[3])
  if redis.call('EXISTS', K.follow) == 1 then
    redis.call('PUBLISH', CHANNEL, 'p ' .. ARGV[1])
  end
  return {1, flagged}
end
return {0, flagged}
