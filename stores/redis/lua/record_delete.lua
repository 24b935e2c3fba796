#!lua
-- Deletes a hash record and its index entry.
-- KEYS[1] record hash  KEYS[2] index   ARGV[1] id
-- Returns 1 when it existed, else 0. Cost: O(log n).
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return existed
