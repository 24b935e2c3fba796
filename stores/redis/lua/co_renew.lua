#!lua
-- Extends a turn still held by this incarnation at this fence.
-- KEYS[1] H (the chat's hash)  KEYS[2] Q (the chat's queue)
-- ARGV[1] incarnation  ARGV[2] fence  ARGV[3] lease ms  ARGV[4] ttl ms
-- Returns {new deadline, now} when renewed, {0, now} when the turn was
-- lost (expired, taken over or released). Cost: O(1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'fence', 'o_dl')
if o[1] ~= ARGV[1] or o[2] ~= ARGV[2] or tonumber(o[3]) <= now then
  return {0, now}
end
local dl = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'o_dl', string.format('%d', dl))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {dl, now}
