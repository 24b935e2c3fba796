#!lua
-- Ends a current claim, storing the next slot; a stale token changes nothing.
-- KEYS[1] schedule hash
-- ARGV[1] owner  ARGV[2] token  ARGV[3] next run  ARGV[4] done (0/1)  ARGV[5] now
-- Returns 1 when committed, else 0. Cost: O(1).
local f = redis.call('HMGET', KEYS[1], 'deleted', 'token', 'owner')
if f[1] ~= '0' or f[2] ~= ARGV[2] or f[3] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'next', ARGV[3], 'done', ARGV[4], 'owner', '',
           'until', 0, 'claimed', 0, 'updated', ARGV[5])
return 1
