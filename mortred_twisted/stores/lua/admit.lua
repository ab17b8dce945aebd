-- ADMIT. KEYS: depth done uses holders done_owner seq pending index queue fair
-- band_low band_normal band_high, job, [idem]
-- ARGV: max_queue, job_id, task_id, request, principal, idempotency key ('' none),
-- fingerprint, webhook url ('' none), webhook events (comma list), band, the
-- caller's limit of pending + running jobs (0 none), its weight
-- -> {admitted (1; 0 full; -1 id taken; 2 replayed; 3 key conflict; 4 the caller's
-- limit reached), depth, job id (4: the limit)}
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
      touch(job)
      return {2, d, job}
    end
    redis.call('DEL', idem)  -- its job is gone (retention): the key is free again
  end
end
local caller, band = ARGV[5], ARGV[10]
local limit = tonumber(ARGV[11])
if limit > 0 and tonumber(redis.call('HGET', K.fair, 'a:' .. caller) or '0') >= limit then
  return {4, d, ARGV[11]}
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
-- its place in the fair order: start tag max(band time, its flow's finish tag)
local flow = 'f:' .. band .. ':' .. caller
local start = math.max(fget('v:' .. band), fget(flow))
local fin = start + math.floor(720720 / tonumber(ARGV[12]))
band_wakes(band)
redis.call('HSET', K.fair, flow, num(fin))
redis.call('HINCRBY', K.fair, 'a:' .. caller, 1)
redis.call('HSET', K.fair, 'l:' .. caller, ARGV[11])
redis.call('HSET', key, 'band', band, 'tag', num(start), 'fin', num(fin))
redis.call('ZADD', K['band_' .. band], num(start), band_member(seq, id))
redis.call('PUBLISH', CHANNEL, 'q ' .. id)
return {1, d + 1, id}
