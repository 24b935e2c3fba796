#!lua
-- Deletes one batch of a chat's log in the cluster:v1 layout: each entry
-- leaves together with its item, so no item is left without its entry.
-- KEYS[1] the log zset (items as in cl_log_append.lua, same slot)
-- ARGV[1] the highest seq to delete (entries appended later survive)
-- ARGV[2] the batch size
-- Returns how many entries up to ARGV[1] remain (0: done). Entries go
-- oldest first, so while one remains the entry at ARGV[1] does too, and a
-- message appended meanwhile gets a greater seq than ARGV[1]: it survives.
-- Cost: O(batch + log n).
local base = string.sub(KEYS[1], 1, -2) .. 'i:'
local ms = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0,
                      tonumber(ARGV[2]))
for _, m in ipairs(ms) do redis.call('DEL', base .. m) end
if #ms > 0 then redis.call('ZREM', KEYS[1], unpack(ms)) end
return redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[1])
