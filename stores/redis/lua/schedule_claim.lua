#!lua
-- Claims the due slot of a task with a fenced lease.
-- KEYS[1] schedule hash
-- ARGV[1] owner  ARGV[2] now  ARGV[3] lease in ms
-- Returns {interrupted (0/1), HGETALL...} or nil when not claimable.
-- Cost: O(1).
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return false end
local f = redis.call('HMGET', h, 'deleted', 'done', 'next', 'owner', 'until')
local now = tonumber(ARGV[2])
if f[1] == '1' or f[2] == '1' or tonumber(f[3]) > now then return false end
if f[4] ~= '' and tonumber(f[5]) > now then return false end
local interrupted = 0
if f[4] ~= '' then interrupted = 1 end
redis.call('HINCRBY', h, 'token', 1)
redis.call('HSET', h, 'owner', ARGV[1], 'until', now + tonumber(ARGV[3]),
           'updated', now)
if interrupted == 0 then redis.call('HSET', h, 'claimed', now) end
local out = redis.call('HGETALL', h)
table.insert(out, 1, interrupted)
return out
