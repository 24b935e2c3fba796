#!lua
-- Reads the newest entries of a chat's log in the cluster:v1 layout.
-- KEYS[1] the log zset (items as in cl_log_append.lua, same slot)
-- ARGV[1] how many (> 0)
-- Returns a flat array member, item, member, item... oldest first; an item
-- is false when its key is missing (damage the caller reports).
-- Cost: O(log n + limit).
local base = string.sub(KEYS[1], 1, -2) .. 'i:'
local ms = redis.call('ZRANGE', KEYS[1], -tonumber(ARGV[1]), -1)
local out = {}
for _, m in ipairs(ms) do
  out[#out + 1] = m
  out[#out + 1] = redis.call('GET', base .. m)
end
return out
