-- QUEUE. KEYS: pending depth fair band_low band_normal band_high
-- ARGV: caller ('' = every caller), scan (pending jobs read for the callers' oldest)
-- -> {depth, pending, oldest admission ms ('' none), now ms, caller1, active1,
-- running1, oldest1 ('' none), limit1, ...}: GET /queue. A caller's oldest pending
-- job is looked for among the `scan` oldest pending jobs of the model.
local out = {depth(), redis.call('ZCARD', K.pending), '', now_ms()}
local head = redis.call('ZRANGE', K.pending, 0, 0, 'WITHSCORES')
if head[2] then out[3] = head[2] end
local oldest = {}
for _, id in ipairs(redis.call('ZRANGE', K.pending, 0, tonumber(ARGV[2]) - 1)) do
  local f = redis.call('HMGET', P .. 'job:' .. id, 'principal', 'created')
  local who = f[1] or ''
  if f[2] and not oldest[who] then oldest[who] = f[2] end
end
local fair = redis.call('HGETALL', K.fair)
for i = 1, #fair, 2 do
  local name = fair[i]
  if string.sub(name, 1, 2) == 'a:' then
    local who = string.sub(name, 3)
    if ARGV[1] == '' or ARGV[1] == who then
      out[#out + 1] = who
      out[#out + 1] = tonumber(fair[i + 1])
      out[#out + 1] = tonumber(redis.call('HGET', K.fair, 'r:' .. who) or '0')
      out[#out + 1] = oldest[who] or ''
      out[#out + 1] = tonumber(redis.call('HGET', K.fair, 'l:' .. who) or '0')
    end
  end
end
return out
