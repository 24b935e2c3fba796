#!lua
-- Releases a lock held by the token; a stale token changes nothing.
-- KEYS[1] lock key  ARGV[1] token
-- Returns 1 when released, else 0. Cost: O(1).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
