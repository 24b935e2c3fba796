#!lua
--@include co_common
-- Gives a request up: its queued ticket, or its turn when it was granted
-- meanwhile (then the next ticket is granted, as on release).
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] incarnation  ARGV[2] request id  ARGV[3] ttl ms
-- ARGV[4] grant channel prefix  ARGV[5] chat key
-- Returns 1 when something was given up, else 0. Cost: O(queue length).
local now = co_now()
local left = 0
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_rep', 'x',
                      'o_prev')
if o[1] == ARGV[1] and o[2] == ARGV[2] then
  -- A granted request that leaves never ran its step: the chat's last
  -- holder is still the one before this grant.
  co_clear(o[5])
  left = 1
else
  local e = co_find(ARGV[1], ARGV[2])
  if e then left = redis.call('LREM', KEYS[2], 1, e) end
end
co_expire(now, ARGV[4], ARGV[5])
if not redis.call('HGET', KEYS[1], 'o_inc') then
  co_grant_next(now, '', ARGV[4], ARGV[5])
end
co_keep(now, ARGV[3], o[4]) -- x: only co_keep writes it
return left
