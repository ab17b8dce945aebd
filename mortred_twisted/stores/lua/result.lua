-- RESULT. KEYS: done uses holders done_owner, job
-- ARGV: job_id -> false, or {state, task, result, principal}; refreshes the LRU
-- position.
local f = redis.call('HMGET', K.job, 'state', 'task', 'result', 'completed', 'principal')
if not f[1] then return false end
if f[4] then touch(ARGV[1]) end
if f[1] ~= 'done' then return {f[1], f[2], false, f[5] or ''} end
return {f[1], f[2], f[3], f[5] or ''}
