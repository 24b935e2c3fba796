#!lua
-- Migration back: writes a chat's whole log in the legacy layout.
-- KEYS[1] log list  KEYS[2] log sequence
-- ARGV[1] "keep" (an existing log wins), "replace", or "append" (a later
--   part of a log too long for one call)  ARGV[2] last seq
-- ARGV[3..] entries, oldest first
-- Returns 1 when written, 0 when the existing log was kept. The sequence
-- never goes back. Cost: O(entries).
if ARGV[1] == 'keep' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[1] ~= 'append' then redis.call('DEL', KEYS[1]) end
if #ARGV >= 3 then redis.call('RPUSH', KEYS[1], unpack(ARGV, 3)) end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[2]) > cur then redis.call('SET', KEYS[2], ARGV[2]) end
return 1
