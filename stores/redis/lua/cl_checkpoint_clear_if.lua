#!lua
-- Removes a checkpoint of the cluster:v1 layout only at the expected
-- revision, with its index entry (the revision key stays).
-- KEYS[1] checkpoint hash  KEYS[2] bucket index
-- ARGV[1] expected revision  ARGV[2] checkpoint key
-- Returns 1 when removed, else 0. Cost: O(log n).
local rev = redis.call('HGET', KEYS[1], 'rev')
if rev and tonumber(rev) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
return 0
