-- LIST. KEYS: index pending (the jobs' hashes are named from the prefix)
-- ARGV: principal ('' with filter 0), filter (1 = only that principal's jobs), states
-- (comma list, '' any), limit, before (sequence; '' = newest) ->
-- {next cursor sequence or '', id1, view1..., id2, view2...} newest first.
-- One call scans at most LIST_SCAN index entries: when it stops there, the cursor
-- says where the next call goes on (a page may then hold fewer than `limit` jobs).
local only, states, limit = ARGV[2] == '1', {}, tonumber(ARGV[4])
for name in string.gmatch(ARGV[3], '[^,]+') do states[name] = true end
local any_state = ARGV[3] == ''
local top = ARGV[5] == '' and '+inf' or ('(' .. ARGV[5])
local out, found, scanned, last_seq = {''}, 0, 0, ''
while scanned < LIST_SCAN do
  local batch = redis.call('ZREVRANGEBYSCORE', K.index, top, '-inf', 'WITHSCORES',
                           'LIMIT', 0, math.min(200, LIST_SCAN - scanned))
  if #batch == 0 then return out end
  for i = 1, #batch, 2 do
    local id, seq = batch[i], batch[i + 1]
    local f = redis.call('HMGET', P .. 'job:' .. id, 'state', 'principal')
    if f[1] and (any_state or states[f[1]]) and (not only or f[2] == ARGV[1]) then
      if found == limit then
        out[1] = last_seq
        return out
      end
      table.insert(out, id)
      table.insert(out, view(id))
      found = found + 1
    end
    scanned = scanned + 1
    last_seq = seq
    top = '(' .. seq
  end
end
out[1] = last_seq  -- the scan budget ran out: go on from the last entry scanned
return out
