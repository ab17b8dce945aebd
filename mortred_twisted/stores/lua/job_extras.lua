-- JOB_EXTRAS. KEYS: job
-- ARGV: job_id -> {webhook url or '', events, cancel flag or ''}
local f = redis.call('HMGET', K.job, 'webhook', 'hook_events', 'cancel')
return {f[1] or '', f[2] or '', f[3] or ''}
