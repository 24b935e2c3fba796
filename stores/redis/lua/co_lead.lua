#!lua
-- Takes or renews a leadership. The lead key expires after the lease, so a
-- dead leader's leadership frees itself.
-- KEYS[1] lead (string: incarnation, PX lease)  KEYS[2] term
-- ARGV[1] incarnation  ARGV[2] lease ms  ARGV[3] the term this incarnation
--   last held the name at, or 0
-- Returns {term, deadline, now} (server ms) when held, or {0, 0, now}
-- while another incarnation leads. Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0, 0, now} end
-- A term that is gone or damaged (an eviction, an operator's write, a
-- number a double cannot hold) is made anew as a new holder's is, even for
-- the holder that leads: a reply without one made the whole renewal batch
-- fail, every turn with it.
local function sound(v)
  return v and v >= 1 and v <= 9007199254740992 and v == math.floor(v)
end
local term = tonumber(redis.call('GET', KEYS[2]) or '')
if not holder or not sound(term) then
  -- A new holder's term: the last one + 1, floored by the server's clock
  -- as a chat's fence is, so a Redis that lost the counter (restarted
  -- without persistence, a failover that lost the last writes) never hands
  -- out a term a holder had in an earlier millisecond (on a clock that
  -- does not go back). Within one millisecond the floor cannot tell terms
  -- apart: a term lost or damaged there is made above the one the caller
  -- last held (ARGV[3]), which covers a holder that still knows its term;
  -- another incarnation taking the name in that millisecond, after both
  -- keys were lost, can still get the same term. Written with %d (a Lua
  -- number would print 1.8e+15).
  local known = tonumber(ARGV[3] or '0') or 0
  term = math.max(sound(term) and term + 1 or 1, now * 1024,
                  sound(known) and known + 1 or 1)
  redis.call('SET', KEYS[2], string.format('%d', term))
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {term, now + tonumber(ARGV[2]), now}
