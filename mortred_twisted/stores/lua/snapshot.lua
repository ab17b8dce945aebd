-- SNAPSHOT. KEYS: pending done uses holders done_owner, fair keys, job
-- ARGV: job_id -> false, or view(); refreshes the LRU position of a terminal job.
local v = view(ARGV[1])
if not v then return false end
touch(ARGV[1])
return v
