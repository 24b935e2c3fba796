#!lua
--@include co_common
-- Where a request stands. An expired holder is replaced on the way, so a
-- grant whose push was lost is found here.
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] incarnation  ARGV[2] request id  ARGV[3] ttl ms
-- ARGV[4] grant channel prefix  ARGV[5] chat key
-- Returns {1, ticket, fence, previous holder, deadline, now} when granted,
-- {0, ticket, now, blocker} when queued, {-1, now} when gone.
-- Cost: O(queue length).
local now = co_now()
co_expire(now, ARGV[4], ARGV[5])
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_tk', 'fence',
                     'o_prev', 'o_dl', 'x')
if o[1] == ARGV[1] and o[2] == ARGV[2] then
  co_keep(now, ARGV[3], o[7])
  return {1, tonumber(o[3]), tonumber(o[4]), o[5], tonumber(o[6]), now}
end
local e, tk = co_find(ARGV[1], ARGV[2])
if e then
  co_keep(now, ARGV[3], o[7])
  return {0, tonumber(tk), now, co_blocker()}
end
return {-1, now}
