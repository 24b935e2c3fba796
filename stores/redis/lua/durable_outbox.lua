#!lua
-- Takes one send of the outbox, refusing a stale holder.
--
--   p:{durable:outbox}:sent   zset  send id -> expiry (server ms)
--   p:{durable:outbox}:fence  hash  chat key -> highest fence that sent
--   p:{durable:outbox}:fexp   zset  chat key -> expiry of its fence
--
-- KEYS[1] sent  KEYS[2] fence  KEYS[3] fexp
-- ARGV[1] send id  ARGV[2] chat key  ARGV[3] fence  ARGV[4] ttl ms
-- Returns 1 (send), 0 (already sent) or -1 (fenced: a higher fence sent).
-- Cost: O(log n) + O(expired, at most 100).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                               'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[1], id)
end
for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now,
                              'LIMIT', 0, 100)) do
  redis.call('HDEL', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
end
local f = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if tonumber(ARGV[3]) < f then return -1 end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local until_ms = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], until_ms, ARGV[2])
return 1
