#!lua
--@include co_common
-- Where a request stands. An expired holder is replaced on the way, so a
-- grant whose push was lost is found here.
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] incarnation  ARGV[2] request id  ARGV[3] ttl ms
-- ARGV[4] grant channel prefix  ARGV[5] chat key
-- Returns {1, ticket, fence, previous holder, deadline, now} when granted,
-- {0, ticket, now, blocker, ahead...} when queued, {-1, now} when gone.
-- `ahead`: the other incarnations queued ahead of this ticket (not this
-- one, not the holder), in queue order, at most 8 (turn_state's
-- queued_ahead), so that a dead one is skipped while still queued.
-- Cost: O(queue length).
local now = co_now()
co_expire(now, ARGV[4], ARGV[5])
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_tk', 'fence',
                     'o_prev', 'o_dl', 'x')
if o[1] == ARGV[1] and o[2] == ARGV[2] then
  co_keep(now, ARGV[3], o[7])
  return {1, tonumber(o[3]), tonumber(o[4]), o[5], tonumber(o[6]), now}
end
local ahead = {}
local e, tk = co_find(ARGV[1], ARGV[2], ahead, o[1])
if e then
  co_keep(now, ARGV[3], o[7])
  local out = {0, tonumber(tk), now, co_blocker()}
  for _, a in ipairs(ahead) do out[#out + 1] = a end
  return out
end
return {-1, now}
