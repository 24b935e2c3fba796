#!lua
-- Takes or renews a leadership. The lead key expires after the lease, so a
-- dead leader's leadership frees itself.
-- KEYS[1] lead (string: incarnation, PX lease)  KEYS[2] term (counter)
-- ARGV[1] incarnation  ARGV[2] lease ms
-- Returns {term, pttl} when held, or nil while another incarnation leads.
-- Cost: O(1).
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return false end
if not holder then redis.call('INCR', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {tonumber(redis.call('GET', KEYS[2])), tonumber(ARGV[2])}
