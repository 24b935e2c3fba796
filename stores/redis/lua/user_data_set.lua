#!lua
-- Stores a user-data value and indexes it with its expiry as the score.
-- KEYS[1] value key  KEYS[2] index (zset: member = key, score = expiry ms or +inf)
-- ARGV[1] member  ARGV[2] JSON value  ARGV[3] TTL in ms, or 0 for none
-- ARGV[4] "keep" (the migration): an existing value is left as it is
-- Returns 1 when written, 0 when kept. Cost: O(log n).
if ARGV[4] == 'keep' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('ZADD', KEYS[2], '+inf', ARGV[1])
end
return 1
