#!lua
-- Removes a checkpoint only at the expected revision (the revision key stays),
-- and its index entry in the cluster:v1 layout. With "damaged" for the
-- revision: only while its revision cannot be read (missing, or not a
-- revision), so a readable one written since (another holder's) stays.
-- KEYS[1] checkpoint hash  KEYS[2] (cluster:v1 only) bucket index
-- ARGV[1] expected revision, or "damaged"  ARGV[2] (with KEYS[2]) the
--   checkpoint key
-- Returns 1 when removed, else 0. Cost: O(1); O(log n) with the index.
local rev = redis.call('HGET', KEYS[1], 'rev')
local match
if ARGV[1] == 'damaged' then
  local n = nil
  if rev then n = tonumber(rev) end
  match = redis.call('EXISTS', KEYS[1]) == 1
          and (n == nil or n < 0 or n > 9007199254740990
               or n ~= math.floor(n))
else
  match = rev and tonumber(rev) == tonumber(ARGV[1])
end
if match then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[2]) end
  return 1
end
return 0
