-- Shared by every script of the job store (jobs/redis_scripts.py prepends it, after
-- `local KEY_NAMES = {...}`: the names of the fixed keys the script receives, in the
-- order of KEYS). Every key a caller can name is passed in KEYS; the hashes of jobs a
-- script finds itself (in the queue stream, in an index) are named from the prefix P,
-- whose hash tag puts them in the slot of the declared keys.
local K = {}
for i, name in ipairs(KEY_NAMES) do K[name] = KEYS[i] end
-- "mortred:{<id>}:" (up to the end of the hash tag)
local P = string.match(KEYS[1], '^(.-}:)')
local CHANNEL = P .. 'events'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The same clock as text with microseconds ("<ms>.<us>"): Lua's number-to-string
-- conversion keeps 14 digits, which would round today's ms to 10 ms.
local function now_ms_text()
  local t = redis.call('TIME')
  local us = string.format('%06d', tonumber(t[2]))
  return t[1] .. string.sub(us, 1, 3) .. '.' .. string.sub(us, 4)
end
local function forget(id)
  local idem = redis.call('HGET', P .. 'job:' .. id, 'idem')
  if idem then redis.call('DEL', idem) end
  redis.call('DEL', P .. 'job:' .. id)
  redis.call('ZREM', K.done, id)
  redis.call('ZREM', K.index, id)
end
local function use_mark()
  return redis.call('INCR', K.uses)
end
local function depth()
  return tonumber(redis.call('GET', K.depth) or '0')
end
-- A job's status fields: {state, task, created, started, completed, error, progress,
-- attempt, now, cancel, queue position (pending: 1 = next; else 0)} or false.
local function view(id)
  local f = redis.call('HMGET', P .. 'job:' .. id, 'state', 'task', 'created', 'started',
                       'completed', 'error', 'progress', 'attempt', 'cancel', 'principal')
  if not f[1] then return false end
  local position = 0
  if f[1] == 'pending' then
    -- pending is scored by admission ms: count the earlier ones, then break ties
    -- within the same millisecond by admission sequence
    local created = f[3]
    position = redis.call('ZCOUNT', K.pending, '-inf', '(' .. created) + 1
    local mine = tonumber(redis.call('HGET', P .. 'job:' .. id, 'seq') or '0')
    for _, other in ipairs(redis.call('ZRANGEBYSCORE', K.pending, created, created)) do
      if other ~= id then
        local seq = tonumber(redis.call('HGET', P .. 'job:' .. other, 'seq') or '0')
        if seq < mine then position = position + 1 end
      end
    end
  end
  return {f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], now_ms(), f[9] or '', position,
          f[10] or ''}
end
-- The one non-terminal -> terminal transition (callers check the state first).
local function terminate(id, state, result, err, ttl_ms, max_completed)
  local key = P .. 'job:' .. id
  redis.call('HSET', key, 'state', state, 'completed', now_ms_text())
  if result then redis.call('HSET', key, 'result', result) end
  if err then redis.call('HSET', key, 'error', err) end
  redis.call('HDEL', key, 'request', 'owner')
  redis.call('DECR', K.depth)
  redis.call('ZREM', K.pending, id)
  redis.call('ZREM', K.leases, id)
  redis.call('ZADD', K.done, use_mark(), id)
  if ttl_ms > 0 then
    redis.call('PEXPIRE', key, ttl_ms)
    local idem = redis.call('HGET', key, 'idem')
    if idem then redis.call('PEXPIRE', idem, ttl_ms) end
  end
  local over = redis.call('ZCARD', K.done) - max_completed
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', K.done, 0, over - 1)) do forget(old) end
  end
  -- The event carries the job's terminal view, so a replica whose waiters it wakes
  -- answers them without reading the job again (one round trip less per wake-up).
  local v = view(id)
  if v then
    redis.call('PUBLISH', CHANNEL, 't ' .. id .. ' ' .. cjson.encode(v))
  else
    redis.call('PUBLISH', CHANNEL, 't ' .. id)
  end
end
local function requeue(id, key, attempt)
  redis.call('HSET', key, 'state', 'pending', 'attempt', attempt)
  redis.call('HDEL', key, 'owner', 'started', 'progress')
  redis.call('ZREM', K.leases, id)
  redis.call('ZADD', K.pending, redis.call('HGET', key, 'created'), id)
  redis.call('XADD', K.queue, '*', 'job', id)
  redis.call('PUBLISH', CHANNEL, 'q ' .. id)
end
