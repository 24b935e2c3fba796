#!lua
--@include co_common
-- Ends a turn held by this incarnation at this fence and grants the next
-- ticket (pushed to its replica).
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] incarnation  ARGV[2] fence  ARGV[3] ttl ms
-- ARGV[4] grant channel prefix  ARGV[5] chat key
-- ARGV[6] what the holder hands to the next one ('' = nothing): pushed
--         with the grant this valid release makes, never with another
-- Returns {released (1/0), now} and, when the next holder is this same
-- incarnation, its grant after them: {.., req, ticket, fence, previous
-- holder, deadline}. Releasing a turn no longer held (expired, released
-- before) changes nothing of the current holder. Cost: O(1), O(queue
-- length) when an expired holder's tickets are dropped.
local now = co_now()
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'fence', 'o_dl', 'o_rep')
local released, g = 0, nil
if o[1] == ARGV[1] and o[2] == ARGV[2] and tonumber(o[3]) > now then
  released = 1
  local queued
  g, queued = co_pass(now, o[4] or '', tonumber(o[2]), ARGV[4], ARGV[5],
                      ARGV[6])
  if not queued then
    -- Nobody waits: the queue does not exist, only H keeps an expiry.
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {released, now}
  end
elseif o[1] and tonumber(o[3]) <= now then
  g = co_expire(now, ARGV[4], ARGV[5])
elseif not o[1] then
  g = co_grant_next(now, '', ARGV[4], ARGV[5])
end
co_touch(ARGV[3])
if g and g[1] == ARGV[1] then
  return {released, now, g[2], tonumber(g[3]), g[4], g[5], g[6]}
end
return {released, now}
