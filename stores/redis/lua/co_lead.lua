#!lua
-- Takes or renews a leadership. The lead key expires after the lease, so a
-- dead leader's leadership frees itself.
-- KEYS[1] lead (string: incarnation, PX lease)  KEYS[2] term
-- ARGV[1] incarnation  ARGV[2] lease ms
-- Returns {term, deadline, now} (server ms) when held, or {0, 0, now}
-- while another incarnation leads. Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, 0, now} end
if not holder then
  -- A new holder's term: the last one + 1, floored by the server's clock
  -- as a chat's fence is, so a Redis that lost the counter (restarted
  -- without persistence, a failover that lost the last writes) never hands
  -- out a term a holder had. Written with %d (a Lua number would print
  -- 1.8e+15).
  local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  redis.call('SET', KEYS[2], string.format('%d', math.max(last + 1, now * 1024)))
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {tonumber(redis.call('GET', KEYS[2])), now + tonumber(ARGV[2]), now}
