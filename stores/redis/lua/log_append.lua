#!lua
-- Appends to a chat's message log and trims it.
-- KEYS[1] log sequence (integer)  KEYS[2] log list
-- ARGV[1] the entry as a JSON object without "seq" ("{...}")  ARGV[2] max length
-- Each list item is {"seq":N,...}. Returns the new seq; an error naming
-- KEYS[1], before anything is written, when the last seq is not one a Lua
-- number holds exactly with its successor (0 to 2^53-2: damaged), so no
-- entry is written with a wrong or "1e+14" seq. Cost: O(1) amortized.
local stored = redis.call('GET', KEYS[1]) or '0'
local last = tonumber(stored)
if last == nil or last < 0 or last >= 9007199254740991
   or last ~= math.floor(last) then
  return redis.error_reply('message log sequence ' .. KEYS[1]
                           .. ' is damaged: "' .. stored
                           .. '" is not a sequence number')
end
local seq = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2],
           '{"seq":' .. string.format('%d', seq) .. ',' .. string.sub(ARGV[1], 2))
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
return seq
