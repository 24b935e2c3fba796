#!lua
-- Migration: writes one string value (user data) and its index entry,
-- keeping the source's remaining TTL; the index is scored by expiry.
-- KEYS[1] value key  KEYS[2] index
-- ARGV[1] "keep" or "replace"  ARGV[2] index member  ARGV[3] TTL ms or 0
-- ARGV[4] the value
-- Returns 1 when written, 0 when the target's value was kept. Cost: O(log n).
if ARGV[1] == 'keep' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ttl)
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[4])
  redis.call('ZADD', KEYS[2], '+inf', ARGV[2])
end
return 1
