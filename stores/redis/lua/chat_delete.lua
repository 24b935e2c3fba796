#!lua
-- Deletes a chat record and its message log.
-- KEYS[1] chat hash  KEYS[2] chat index  KEYS[3] log list  KEYS[4] log sequence
-- ARGV[1] chat key
-- Returns 1 when a record existed, else 0. Cost: O(log length).
local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[1])
return existed
