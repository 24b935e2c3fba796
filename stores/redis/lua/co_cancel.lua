#!lua
-- Gives up a queued ticket of this incarnation.
-- KEYS[1] tix   ARGV[1] incarnation  ARGV[2] ticket
-- PUBLISH channel: ARGV[3]  message: ARGV[4]
-- Returns 1 when removed, else 0. Cost: O(1).
if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
