-- FOLLOW. KEYS: the follow key of every job an event stream of this replica follows
-- ARGV: ttl_ms -> number of keys set. PROGRESS publishes a job's progress only while
-- its follow key exists (no PUBLISH per model step that nobody reads).
for i = 1, #KEYS do redis.call('SET', KEYS[i], '1', 'PX', ARGV[1]) end
return #KEYS
