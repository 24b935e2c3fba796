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
-- Cost: O(1); a retry O(queue length). The uncontended turn, on every
-- turn's path, is five commands: one read of H, one write (the ticket
-- counter with the grant), the queue's length and H's expiry.
local now = co_now()
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_tk', 'fence',
                     'o_prev', 'o_dl', 'last', 'seq')
if o[1] and tonumber(o[6]) <= now then
  -- An expired holder is replaced first (rare): then read H again.
  co_expire(now, ARGV[6], ARGV[7])
  o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_req', 'o_tk', 'fence',
                 'o_prev', 'o_dl', 'last', 'seq')
end
if o[1] == ARGV[1] and o[2] == ARGV[2] then
  co_touch(ARGV[4])
  return {1, tonumber(o[3]), tonumber(o[4]), o[5], tonumber(o[6]), now}
end
if ARGV[8] == '1' then
  local e, tk = co_find(ARGV[1], ARGV[2])
  if e then
    co_touch(ARGV[4])
    return {0, tonumber(tk), now, co_blocker()}
  end
end
local tk = tonumber(o[8] or '0') + 1
if not o[1] and redis.call('LLEN', KEYS[2]) == 0 then
  -- As co_grant, with what the read above already knows. The queue is
  -- empty, so it does not exist and has no expiry to refresh.
  local fence = math.max(tonumber(o[4] or '0') + 1, now * 1024)
  local prev = o[7] or ''
  local dl = now + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'seq', co_int(tk), 'fence', co_int(fence),
             'o_inc', ARGV[1], 'o_rep', ARGV[5], 'o_req', ARGV[2],
             'o_tk', co_int(tk), 'o_dl', co_int(dl), 'o_prev', prev)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1, tk, fence, prev, dl, now}
end
redis.call('HSET', KEYS[1], 'seq', co_int(tk))
if not o[1] then co_grant_next(now, '', ARGV[6], ARGV[7]) end
redis.call('RPUSH', KEYS[2], co_int(tk) .. ' ' .. ARGV[1] .. ' ' .. ARGV[2]
           .. ' ' .. ARGV[3] .. ' ' .. ARGV[5])
co_touch(ARGV[4])
return {0, tk, now, co_blocker()}
