#!lua
-- Replaces a hash record and indexes it (contacts).
-- KEYS[1] record hash  KEYS[2] index (zset, score 0)
-- ARGV[1] id, then field/value pairs
-- Returns 1. Cost: O(fields + log n).
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
