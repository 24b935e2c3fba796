#!lua
-- Appends to a chat's message log and trims it.
-- KEYS[1] log sequence (integer)  KEYS[2] log list
-- ARGV[1] the entry as a JSON object without "seq" ("{...}")  ARGV[2] max length
-- Each list item is {"seq":N,...}. Returns the new seq; an error naming
-- KEYS[1] when it is not a sequence number a Lua number holds exactly
-- (1 to 2^53-1: damaged), so no entry is written with a wrong or
-- "1e+14" seq. Cost: O(1) amortized.
local seq = redis.call('INCR', KEYS[1])
if seq < 1 or seq > 9007199254740991 then
  return redis.error_reply('message log sequence ' .. KEYS[1]
                           .. ' is damaged: ' .. string.format('%.0f', seq)
                           .. ' is not a sequence number')
end
redis.call('RPUSH', KEYS[2],
           '{"seq":' .. string.format('%d', seq) .. ',' .. string.sub(ARGV[1], 2))
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
return seq
