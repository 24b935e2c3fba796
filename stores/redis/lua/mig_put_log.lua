#!lua
-- Migration: writes message log entries into the cluster:v1 layout.
-- KEYS[1] the log zset (items as in cl_log_append.lua, same slot)
-- ARGV[1] "keep" (an existing item wins) or "replace"
-- ARGV[2..] seq, entry JSON pairs
-- Returns how many entries were written. Cost: O(entries * log n).
local base = string.sub(KEYS[1], 1, -2) .. 'i:'
local n = 0
for i = 2, #ARGV, 2 do
  local item = base .. ARGV[i]
  if ARGV[1] == 'replace' or redis.call('EXISTS', item) == 0 then
    redis.call('SET', item, ARGV[i + 1])
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i])
    n = n + 1
  end
end
return n
