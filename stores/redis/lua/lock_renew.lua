#!lua
-- Extends a lock held by the token.
-- KEYS[1] lock key  ARGV[1] token  ARGV[2] TTL in ms
-- Returns 1 when renewed, else 0. Cost: O(1).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
