#!lua
-- Appends to a chat's message log in the cluster:v1 layout and trims it.
--
--   p:{m:<chat>}:z        zset    member = seq (decimal), score = seq
--   p:{m:<chat>}:i:<seq>  string  the entry, {"seq":N,...} JSON
--
-- KEYS[1] the log zset. The item keys are built from KEYS[1] (its name
-- without the trailing "z", then "i:<seq>"): they carry the same hash tag,
-- so they live in its slot, but cannot be declared because the seq is
-- chosen here.
-- ARGV[1] the entry as a JSON object without "seq" ("{...}")  ARGV[2] max length
-- Returns the new seq: one more than the newest entry (1 for an empty log).
-- Cost: O(log n), plus one DEL per trimmed entry.
local base = string.sub(KEYS[1], 1, -2) .. 'i:'
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local seq = 1
if last[2] then seq = tonumber(last[2]) + 1 end
redis.call('SET', base .. seq, '{"seq":' .. seq .. ',' .. string.sub(ARGV[1], 2))
redis.call('ZADD', KEYS[1], seq, seq)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
if over > 0 then
  local old = redis.call('ZRANGE', KEYS[1], 0, over - 1)
  for _, m in ipairs(old) do redis.call('DEL', base .. m) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
return seq
