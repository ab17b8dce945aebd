-- ADMIT. KEYS: depth done uses seq pending index queue, job, [idem]
-- ARGV: max_queue, job_id, task_id, request, principal, idempotency key ('' none),
-- fingerprint, webhook url ('' none), webhook events (comma list)
-- -> {admitted (1; 0 full; -1 id taken; 2 replayed; 3 key conflict), depth, job id}
local d = depth()
local idem = false
if ARGV[6] ~= '' then
  idem = K.idem
  local known = redis.call('GET', idem)
  if known then
    local sep = string.find(known, ' ', 1, true)
    local job, fp = string.sub(known, 1, sep - 1), string.sub(known, sep + 1)
    if redis.call('EXISTS', P .. 'job:' .. job) == 1 then
      if fp ~= ARGV[7] then return {3, d, ''} end
      if redis.call('HGET', P .. 'job:' .. job, 'completed') then
        redis.call('ZADD', K.done, 'XX', use_mark(), job)
      end
      return {2, d, job}
    end
    redis.call('DEL', idem)  -- its job is gone (retention): the key is free again
  end
end
if d >= tonumber(ARGV[1]) then return {0, d, ''} end
local id = ARGV[2]
local key = K.job
if redis.call('EXISTS', key) == 1 then return {-1, d, ''} end
local now = now_ms()
local seq = redis.call('INCR', K.seq)
redis.call('HSET', key, 'state', 'pending', 'task', ARGV[3], 'created', now,
           'attempt', 1, 'request', ARGV[4], 'principal', ARGV[5], 'seq', seq)
if idem then
  redis.call('SET', idem, id .. ' ' .. ARGV[7])
  redis.call('HSET', key, 'idem', idem)
end
if ARGV[8] ~= '' then redis.call('HSET', key, 'webhook', ARGV[8], 'hook_events', ARGV[9]) end
redis.call('INCR', K.depth)
redis.call('ZADD', K.pending, now, id)
redis.call('ZADD', K.index, seq, id)
redis.call('XADD', K.queue, '*', 'job', id)
redis.call('PUBLISH', CHANNEL, 'q ' .. id)
return {1, d + 1, id}
