#!lua
-- Reads entries of a chat's log in the cluster:v1 layout (see
-- cl_log_append.lua), every key declared: the caller read the members with
-- ZRANGE first and names them with their item keys, so while the slot
-- moves Redis answers ASK or TRYAGAIN instead of a script reading half of
-- them on each node.
-- KEYS[1] the log zset  KEYS[2..n+1] the item keys of ARGV[1..n]
-- ARGV[1..n] members of the log, oldest first
-- Returns a flat array member, item, member, item... for the members still
-- in the log (one deleted since the caller's ZRANGE is left out); an item
-- is false when its key is missing while its entry is there (damage the
-- caller reports).
-- Cost: O(n log n).
local out = {}
for i, m in ipairs(ARGV) do
  if redis.call('ZSCORE', KEYS[1], m) then
    out[#out + 1] = m
    out[#out + 1] = redis.call('GET', KEYS[i + 1])
  end
end
return out
