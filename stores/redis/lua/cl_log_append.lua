#!lua
-- Appends to a chat's message log in the cluster:v1 layout.
--
--   p:{m:<chat>}:z        zset    member = seq (decimal), score = seq
--   p:{m:<chat>}:i:<seq>  string  the entry, {"seq":N,...} JSON
--
-- Every key is declared, so while the slot moves Redis answers ASK or
-- TRYAGAIN before anything runs (a key built inside a script would fail
-- with "non local key" half-way through a move). The caller names the
-- item key of the seq it expects to get; when another append took that
-- seq first, nothing is written and the caller tries again with the seq
-- returned.
-- KEYS[1] the log zset  KEYS[2] the item key of seq ARGV[2]
-- ARGV[1] the entry as a JSON object without "seq" ("{...}")
-- ARGV[2] the expected seq: one more than the newest entry (1 when empty)
-- Returns {1, seq, length} when appended (length: entries now in the log,
-- for the caller's trimming, see cl_log_delete.lua); {0, seq} when the next
-- seq is not ARGV[2] (nothing written; seq is the one to ask for).
-- Cost: O(log n).
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local seq = 1
if last[2] then seq = tonumber(last[2]) + 1 end
-- Past 2^53-1 a Lua number no longer holds every seq (and from 1e14 it
-- prints as "1e+14"): the log's newest score is damaged.
if seq < 1 or seq > 9007199254740991 or seq ~= math.floor(seq) then
  return redis.error_reply('message log ' .. KEYS[1] .. ' is damaged: its '
                           .. 'newest seq ' .. tostring(last[2])
                           .. ' is not a sequence number')
end
if seq ~= tonumber(ARGV[2]) then return {0, seq} end
local n = string.format('%d', seq)
redis.call('SET', KEYS[2], '{"seq":' .. n .. ',' .. string.sub(ARGV[1], 2))
redis.call('ZADD', KEYS[1], n, n)
return {1, seq, redis.call('ZCARD', KEYS[1])}
