#!lua
-- Takes a lock if free and hands out the next fence.
-- KEYS[1] lock key (value: token, with a TTL)  KEYS[2] fence counter
-- ARGV[1] token  ARGV[2] TTL in ms
-- Returns the fence, or nil when the lock is held. Cost: O(1).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
