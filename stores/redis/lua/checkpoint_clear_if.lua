#!lua
-- Removes a checkpoint only at the expected revision (the revision key stays).
-- KEYS[1] checkpoint hash   ARGV[1] expected revision
-- Returns 1 when removed, else 0. Cost: O(1).
local rev = redis.call('HGET', KEYS[1], 'rev')
if rev and tonumber(rev) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
