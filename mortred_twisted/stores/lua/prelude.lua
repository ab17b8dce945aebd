-- Shared by every script of the job store (stores/redis_scripts.py prepends it, after
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
-- Retention per caller (jobs/retention.py, the same policy): K.done holds every
-- terminal job -> its last use (a use mark), done:<caller> the same for one caller,
-- K.holders each caller -> how many terminal jobs it holds, K.done_owner each terminal
-- job -> its caller (so the TTL sweep finds the caller of a job whose hash expired).
local function done_of(caller) return P .. 'done:' .. caller end
local function use_mark()
  return redis.call('INCR', K.uses)
end
local function retain(id, caller)
  local mark = use_mark()
  redis.call('ZADD', K.done, mark, id)
  redis.call('ZADD', done_of(caller), mark, id)
  redis.call('HSET', K.done_owner, id, caller)
  redis.call('ZINCRBY', K.holders, 1, caller)
end
-- A use (poll, result, replayed submit, cancel) of a retained job: it becomes its
-- caller's most recently used. No-op unless retained.
local function touch(id)
  local caller = redis.call('HGET', K.done_owner, id)
  if not caller then return end
  local mark = use_mark()
  redis.call('ZADD', K.done, 'XX', mark, id)
  redis.call('ZADD', done_of(caller), 'XX', mark, id)
end
local function unretain(id)
  redis.call('ZREM', K.done, id)
  local caller = redis.call('HGET', K.done_owner, id)
  if not caller then return end
  redis.call('HDEL', K.done_owner, id)
  redis.call('ZREM', done_of(caller), id)
  if tonumber(redis.call('ZINCRBY', K.holders, -1, caller)) <= 0 then
    redis.call('ZREM', K.holders, caller)
  end
end
local function forget(id)
  local idem = redis.call('HGET', P .. 'job:' .. id, 'idem')
  if idem then redis.call('DEL', idem) end
  redis.call('DEL', P .. 'job:' .. id)
  unretain(id)
  redis.call('ZREM', K.index, id)
end
-- The job retention removes next while more than max_completed are held: the least
-- recently used of the caller holding the most (ties: the caller whose least
-- recently used job is the oldest), so a caller within its share (max_completed /
-- callers holding any) loses nothing to another's. RetainedJobs.victim.
local function retention_victim()
  local top = redis.call('ZREVRANGE', K.holders, 0, 0, 'WITHSCORES')
  if not top[1] then
    return redis.call('ZRANGE', K.done, 0, 0)[1]  -- entries written before issue 19
  end
  local best, oldest = nil, nil
  for _, caller in ipairs(redis.call('ZRANGEBYSCORE', K.holders, top[2], top[2])) do
    local head = redis.call('ZRANGE', done_of(caller), 0, 0, 'WITHSCORES')
    if head[1] and (not best or tonumber(head[2]) < oldest) then
      best, oldest = head[1], tonumber(head[2])
    end
  end
  return best
end
local function evict_over(max_completed)
  while redis.call('ZCARD', K.done) > max_completed do
    local victim = retention_victim()
    if not victim then return end
    forget(victim)
  end
end
-- The fair order (jobs/fair_queue.py, the same integer arithmetic): pending jobs in
-- one ZSET per band scored by start tag, each member "<admission sequence, 15
-- digits>:<job id>" (a ZSET orders equal scores by member: the band's order is the
-- ZSET's, ties to the earlier admission, so a pick or a rank reads no job); K.fair holds each band's virtual time
-- (v:<band>) and pass (p:<band>), the last start's pass (gp), each flow's finish tag
-- (f:<band>:<caller>), each caller's pending + running jobs (a:<caller>), its running
-- jobs (r:<caller>) and the limit it was last admitted under (l:<caller>).
local BANDS = {'low', 'normal', 'high'}
local BAND_RANK = {low = 0, normal = 1, high = 2}
local BAND_WEIGHT = {low = 1, normal = 4, high = 16}
local BAND_STRIDE = {low = 16, normal = 4, high = 1}
local function num(x) return string.format('%.0f', x) end
local function fget(field) return tonumber(redis.call('HGET', K.fair, field) or '0') end
local function band_member(seq, id) return string.format('%015.0f', tonumber(seq) or 0) .. ':' .. id end
local function member_id(member) return string.match(member, '^%d+:(.+)$') or member end
-- A band that becomes non-empty gets no credit for its idle time.
local function band_wakes(band)
  if redis.call('ZCARD', K['band_' .. band]) == 0 then
    local p, gp = fget('p:' .. band), fget('gp')
    if gp > p then redis.call('HSET', K.fair, 'p:' .. band, num(gp)) end
  end
end
-- A job ends: its caller holds one job less; a pending one leaves its band and, if
-- it was its flow's last, gives its virtual time back (as FairQueue.release).
local function fair_release(id, key, was_pending)
  local f = redis.call('HMGET', key, 'band', 'tag', 'fin', 'principal', 'seq')
  if not f[1] then return end
  local caller = f[4] or ''
  if was_pending then
    redis.call('ZREM', K['band_' .. f[1]], band_member(f[5], id))
    local flow = 'f:' .. f[1] .. ':' .. caller
    if redis.call('HGET', K.fair, flow) == f[3] then redis.call('HSET', K.fair, flow, f[2]) end
  elseif redis.call('HINCRBY', K.fair, 'r:' .. caller, -1) <= 0 then
    redis.call('HDEL', K.fair, 'r:' .. caller)
  end
  if redis.call('HINCRBY', K.fair, 'a:' .. caller, -1) <= 0 then
    redis.call('HDEL', K.fair, 'a:' .. caller, 'r:' .. caller, 'l:' .. caller)
  end
end
local function depth()
  return tonumber(redis.call('GET', K.depth) or '0')
end
-- A job's status fields: {state, task, created, started, completed, error, progress,
-- attempt, now, cancel, queue position (pending: 1 = next; else 0)} or false.
local function view(id)
  local f = redis.call('HMGET', P .. 'job:' .. id, 'state', 'task', 'created', 'started',
                       'completed', 'error', 'progress', 'attempt', 'cancel', 'principal',
                       'band', 'seq')
  if not f[1] then return false end
  local position = 0
  local band = f[1] == 'pending' and f[11]
  local rank = band and redis.call('ZRANK', K['band_' .. band], band_member(f[12], id))
  if rank then
    -- its rank in its band's order, plus what the other bands start meanwhile by
    -- their share (FairQueue.position)
    rank = rank + 1
    position = rank
    for _, b in ipairs(BANDS) do
      if b ~= band then
        local n = redis.call('ZCARD', K['band_' .. b])
        position = position + math.min(n, math.floor(rank * BAND_WEIGHT[b] / BAND_WEIGHT[band]))
      end
    end
  elseif f[1] == 'pending' then
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
-- Every job this script ended, as {id, state, id, state, ...}: a script that ends
-- jobs nobody asked it to end (MAINTAIN, CLAIM) returns it, so the replica that ran
-- the script counts each of them and sends its webhook, once.
local ENDED = {}
-- The one non-terminal -> terminal transition (callers check the state first).
local function terminate(id, state, result, err, ttl_ms, max_completed)
  local key = P .. 'job:' .. id
  table.insert(ENDED, id)
  table.insert(ENDED, state)
  fair_release(id, key, redis.call('HGET', key, 'state') == 'pending')
  redis.call('HSET', key, 'state', state, 'completed', now_ms_text())
  if result then redis.call('HSET', key, 'result', result) end
  if err then redis.call('HSET', key, 'error', err) end
  redis.call('HDEL', key, 'request', 'owner')
  redis.call('DECR', K.depth)
  redis.call('ZREM', K.pending, id)
  redis.call('ZREM', K.leases, id)
  retain(id, redis.call('HGET', key, 'principal') or '')
  if ttl_ms > 0 then
    redis.call('PEXPIRE', key, ttl_ms)
    local idem = redis.call('HGET', key, 'idem')
    if idem then redis.call('PEXPIRE', idem, ttl_ms) end
  end
  evict_over(max_completed)
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
  -- back into its band with its own start tag: it keeps its place in the order
  local f = redis.call('HMGET', key, 'band', 'tag', 'principal', 'seq')
  local band = f[1] or 'normal'
  if f[1] and redis.call('HINCRBY', K.fair, 'r:' .. (f[3] or ''), -1) <= 0 then
    redis.call('HDEL', K.fair, 'r:' .. (f[3] or ''))
  end
  band_wakes(band)
  redis.call('ZADD', K['band_' .. band], f[2] or num(fget('v:' .. band)), band_member(f[4], id))
  redis.call('PUBLISH', CHANNEL, 'q ' .. id)
end
