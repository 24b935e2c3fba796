#!lua
-- Takes or renews a leadership. The lead key expires after the lease, so a
-- dead leader's leadership frees itself.
-- KEYS[1] lead (string: incarnation, PX lease)  KEYS[2] term (counter)
-- ARGV[1] incarnation  ARGV[2] lease ms
-- Returns {term, deadline, now} (server ms) when held, or {0, 0, now}
-- while another incarnation leads. Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, 0, now} end
if not holder then redis.call('INCR', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {tonumber(redis.call('GET', KEYS[2])), now + tonumber(ARGV[2]), now}
