#!lua
-- Skips what a dead replica holds in a chat's queue: its turn, and its
-- ticket at the head of the queue. The caller saw its heartbeat gone.
-- KEYS[1] tix  KEYS[2] serving  KEYS[3] owner  KEYS[4] last
-- ARGV[1] the dead incarnation   PUBLISH channel: ARGV[2]   message: ARGV[3]
-- Returns 1 when something was skipped, else 0. Cost: O(1).
local skipped = 0
local o = redis.call('HMGET', KEYS[3], 'inc', 'replica', 'ticket')
local serving = tonumber(redis.call('GET', KEYS[2]) or '1')
if o[1] == ARGV[1] then
  redis.call('HSET', KEYS[4], 'replica', o[2])
  serving = math.max(serving, tonumber(o[3]) + 1)
  redis.call('DEL', KEYS[3])
  skipped = 1
elseif not o[1] and redis.call('HGET', KEYS[1], serving) == ARGV[1] then
  redis.call('HDEL', KEYS[1], serving)
  serving = serving + 1
  skipped = 1
end
redis.call('SET', KEYS[2], serving)
if skipped == 1 then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return skipped
