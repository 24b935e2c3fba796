#!lua
-- Migration: writes message log entries into the cluster:v1 layout.
-- KEYS[1] the log zset; KEYS[1 + j] the item key of the j-th entry (as in
-- cl_log_append.lua, same slot). Every key is declared, so a slot that
-- moves meanwhile answers ASK or TRYAGAIN instead of a "non local key"
-- failure half-way.
-- ARGV[1] "keep" (an existing item wins) or "replace"
-- ARGV[2j], ARGV[2j + 1] the j-th entry's seq and JSON
-- Returns how many entries were written. Cost: O(entries * log n).
local n = 0
for j = 1, (#ARGV - 1) / 2 do
  local item = KEYS[1 + j]
  if ARGV[1] == 'replace' or redis.call('EXISTS', item) == 0 then
    redis.call('SET', item, ARGV[2 * j + 1])
    redis.call('ZADD', KEYS[1], ARGV[2 * j], ARGV[2 * j])
    n = n + 1
  end
end
return n
