#!lua
-- Appends to a chat's message log and trims it.
-- KEYS[1] log sequence (integer)  KEYS[2] log list
-- ARGV[1] the entry as a JSON object without "seq" ("{...}")  ARGV[2] max length
-- Each list item is {"seq":N,...}. Returns the new seq. Cost: O(1) amortized.
local seq = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], '{"seq":' .. seq .. ',' .. string.sub(ARGV[1], 2))
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
return seq
