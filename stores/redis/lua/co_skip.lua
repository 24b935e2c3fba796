#!lua
--@include co_common
-- Skips a dead incarnation in a chat: its queued tickets, and its turn once
-- that turn's deadline passed. The caller saw its heartbeat gone (a
-- heartbeat lives in another slot, so the script cannot look itself). A
-- turn keeps its whole lease even so: the incarnation may be frozen, not
-- dead, holding a turn granted while it was frozen (its heartbeat ran out
-- first), and it may use that turn when it resumes, until its deadline.
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] the dead incarnation  ARGV[2] ttl ms
-- ARGV[3] grant channel prefix  ARGV[4] chat key
-- Returns 1 when something was skipped, else 0. Cost: O(queue length).
local now = co_now()
local skipped = 0
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_rep', 'o_dl', 'x')
if o[1] == ARGV[1] and tonumber(o[3]) <= now then
  co_clear(nil) -- unknown whether it ran: see co_expire
  skipped = 1
end
if co_drop(ARGV[1]) > 0 then skipped = 1 end
if not redis.call('HGET', KEYS[1], 'o_inc') then
  co_grant_next(now, '', ARGV[3], ARGV[4])
end
co_keep(now, ARGV[2], o[4]) -- x: only co_keep writes it
return skipped
