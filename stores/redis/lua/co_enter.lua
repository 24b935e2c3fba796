#!lua
--@include co_common
-- Takes a ticket for a request and grants the turn at once when nobody
-- holds or waits for the chat.
--
-- KEYS[1] H  KEYS[2] Q  (see lib/co_common.lua)
-- ARGV[1] incarnation  ARGV[2] request id  ARGV[3] lease ms  ARGV[4] ttl ms
-- ARGV[5] replica id   ARGV[6] grant channel prefix  ARGV[7] chat key
-- ARGV[8] '1' on a retry (the reply of an earlier call was lost)
-- Returns {1, ticket, fence, previous holder or '', deadline, now} when
-- granted; {0, ticket, now, blocker} when queued. A retry of a request
-- already granted or queued returns that grant or ticket again.
-- Cost: O(1); a retry O(queue length).
local now = co_now()
co_expire(now, ARGV[6], ARGV[7])
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_tk', 'fence',
                     'o_prev', 'o_dl')
co_touch(ARGV[4])
if o[1] == ARGV[1] and o[2] == ARGV[2] then
  return {1, tonumber(o[3]), tonumber(o[4]), o[5], tonumber(o[6]), now}
end
if ARGV[8] == '1' then
  local e, tk = co_find(ARGV[1], ARGV[2])
  if e then return {0, tonumber(tk), now, co_blocker()} end
end
local tk = redis.call('HINCRBY', KEYS[1], 'seq', 1)
if not o[1] and redis.call('LLEN', KEYS[2]) == 0 then
  local g = co_grant(now, ARGV[1], ARGV[5], ARGV[2], tk, tonumber(ARGV[3]))
  co_touch(ARGV[4])
  return {1, tk, g[4], g[5], g[6], now}
end
if not o[1] then co_grant_next(now, '', ARGV[6], ARGV[7]) end
redis.call('RPUSH', KEYS[2], tk .. ' ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' '
           .. ARGV[3] .. ' ' .. ARGV[5])
co_touch(ARGV[4])
return {0, tk, now, co_blocker()}
