#!lua
-- Extends a turn still held by this incarnation at this fence.
-- KEYS[1] H (the chat's hash)  KEYS[2] Q (the chat's queue)
-- ARGV[1] incarnation  ARGV[2] fence  ARGV[3] lease ms  ARGV[4] ttl ms
-- Returns {new deadline, now} when renewed, {0, now} when the turn was
-- lost (expired, taken over or released). Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'fence', 'o_dl', 'x')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or tonumber(o[3]) <= now then
  return {0, now}
end
local dl = now + tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
-- The keys' expiry as co_keep (lib/co_common.lua) keeps it: refreshed
-- only when less than three quarters of a ttl are left of x.
if not o[4] or tonumber(o[4]) - now < ttl * 0.75 then
  redis.call('HSET', KEYS[1], 'o_dl', string.format('%d', dl), 'x',
             string.format('%d', now + ttl))
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
else
  redis.call('HSET', KEYS[1], 'o_dl', string.format('%d', dl))
end
return {dl, now}
