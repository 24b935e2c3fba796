#!lua
-- Ends a turn and wakes the replicas waiting for the chat.
-- KEYS[1] owner  KEYS[2] serving  KEYS[3] last
-- ARGV[1] incarnation  ARGV[2] fence  PUBLISH channel: ARGV[3]  message: ARGV[4]
-- Returns 1 when released, 0 when the turn was no longer held. Cost: O(1).
local o = redis.call('HMGET', KEYS[1], 'inc', 'fence', 'replica', 'ticket')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[3], 'replica', o[3])
local serving = tonumber(redis.call('GET', KEYS[2]) or '1')
redis.call('SET', KEYS[2], math.max(serving, tonumber(o[4]) + 1))
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
