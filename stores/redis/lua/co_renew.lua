#!lua
-- Extends a turn still held by this incarnation and fence.
-- KEYS[1] owner   ARGV[1] incarnation  ARGV[2] fence  ARGV[3] lease ms
-- Returns 1 when renewed, 0 when the turn was lost. Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[1], 'inc', 'fence', 'deadline')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or tonumber(o[3]) <= now then
  return 0
end
redis.call('HSET', KEYS[1], 'deadline', now + tonumber(ARGV[3]))
return 1
