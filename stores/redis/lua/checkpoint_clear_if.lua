#!lua
-- Removes a checkpoint only at the expected revision (the revision key stays),
-- and its index entry in the cluster:v1 layout. With "damaged" for the
-- revision: only while its revision cannot be read (missing, or not a
-- non-negative integer as the store reads it), so a readable one written
-- since (another holder's) stays.
-- KEYS[1] checkpoint hash  KEYS[2] (cluster:v1 only) bucket index
-- ARGV[1] expected revision, or "damaged"  ARGV[2] (with KEYS[2]) the
--   checkpoint key
-- Returns 1 when removed, else 0. Cost: O(1); O(log n) with the index.
-- Readable as the store reads a revision: digits only (no sign, point,
-- exponent, space or hex, which tonumber would take), within a signed
-- 64-bit integer (compared as text: a double cannot tell its last digits).
local function readable(v)
  if not v then return false end -- (missing: HGET gives false)
  local digits = string.match(v, '^0*(%d+)$') -- (leading zeros off)
  return digits ~= nil
         and (#digits < 19
              or (#digits == 19 and digits <= '9223372036854775807'))
end
local rev = redis.call('HGET', KEYS[1], 'rev')
local match
if ARGV[1] == 'damaged' then
  match = redis.call('EXISTS', KEYS[1]) == 1 and not readable(rev)
else
  match = rev and tonumber(rev) == tonumber(ARGV[1])
end
if match then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[2]) end
  return 1
end
return 0
