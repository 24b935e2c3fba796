#!lua
-- Gives a leader lease up if the owner holds it (the token stays).
-- KEYS[1] lease hash   ARGV[1] owner
-- Returns 1 when released, else 0. Cost: O(1).
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', '')
  return 1
end
return 0
