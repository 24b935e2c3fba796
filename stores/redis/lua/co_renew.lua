#!lua
--@include co_common
-- Extends a turn still held by this incarnation at this fence.
-- KEYS[1] H (the chat's hash)  KEYS[2] Q (the chat's queue)
-- ARGV[1] incarnation  ARGV[2] fence  ARGV[3] lease ms  ARGV[4] ttl ms
-- Returns {new deadline, now} when renewed, {0, now} when the turn was
-- lost (expired, taken over or released). Cost: O(1).
local now = co_now()
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'fence', 'o_dl', 'x')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or tonumber(o[3]) <= now then
  return {0, now}
end
local dl = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'o_dl', co_int(dl))
co_keep(now, ARGV[4], o[4])
return {dl, now}
