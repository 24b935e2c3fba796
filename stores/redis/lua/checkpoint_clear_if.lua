#!lua
-- Removes a checkpoint only at the expected revision (the revision key stays),
-- and its index entry in the cluster:v1 layout.
-- KEYS[1] checkpoint hash  KEYS[2] (cluster:v1 only) bucket index
-- ARGV[1] expected revision  ARGV[2] (with KEYS[2]) the checkpoint key
-- Returns 1 when removed, else 0. Cost: O(1); O(log n) with the index.
local rev = redis.call('HGET', KEYS[1], 'rev')
if rev and tonumber(rev) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[2]) end
  return 1
end
return 0
