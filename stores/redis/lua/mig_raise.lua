#!lua
-- Migration: raises a counter (lock fence, leadership term, checkpoint
-- revision) to a value, never lowering it ("set if greater").
-- KEYS[1] counter  ARGV[1] the source's value
-- Returns 1 when raised, 0 when the target's was already as high.
-- Cost: O(1).
local cur = tonumber(redis.call('GET', KEYS[1]) or '')
local v = tonumber(ARGV[1])
if v == nil then return redis.error_reply('ERR not an integer: ' .. ARGV[1]) end
if cur and cur >= v then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
