#!lua
-- Takes the next ticket in a chat's queue.
-- KEYS[1] seq (counter)  KEYS[2] tix (hash: ticket -> incarnation)
-- ARGV[1] incarnation
-- Returns the ticket. Cost: O(1).
local t = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], t, ARGV[1])
return t
