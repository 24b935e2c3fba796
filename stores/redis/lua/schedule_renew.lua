#!lua
-- Extends a current claim.
-- KEYS[1] schedule hash
-- ARGV[1] owner  ARGV[2] token  ARGV[3] now  ARGV[4] lease in ms
-- Returns 1 when renewed, else 0. Cost: O(1).
local f = redis.call('HMGET', KEYS[1], 'deleted', 'token', 'owner', 'until')
if f[1] ~= '0' or f[2] ~= ARGV[2] or f[3] ~= ARGV[1]
   or tonumber(f[4]) <= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'until', tonumber(ARGV[3]) + tonumber(ARGV[4]),
           'updated', ARGV[3])
return 1
