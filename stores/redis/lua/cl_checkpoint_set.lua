#!lua
-- Writes a checkpoint in the cluster:v1 layout, unconditionally or as
-- compare-and-set (the encoding of checkpoint_set.lua), and indexes it.
-- KEYS[1] checkpoint hash  KEYS[2] revision key  KEYS[3] bucket index (zset:
--   member = checkpoint key, score = expiry in Unix ms or +inf)
-- ARGV[1] "any", or the expected live revision (0 = no live checkpoint)
-- ARGV[2] body  ARGV[3] created_at for a new conversation (Unix ms)
-- ARGV[4] absolute expiry in Unix ms (ephemeral), or 0  ARGV[5] checkpoint key
-- Returns the new revision, or nil when the expected revision differs.
-- Cost: O(log n).
local live = redis.call('EXISTS', KEYS[1]) == 1
local current = 0
if live then current = tonumber(redis.call('HGET', KEYS[1], 'rev')) or 0 end
if ARGV[1] ~= 'any' and tonumber(ARGV[1]) ~= current then return false end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if current > last then last = current end
local rev = last + 1
redis.call('SET', KEYS[2], rev)
local created = ARGV[3]
if live then created = redis.call('HGET', KEYS[1], 'created') or created end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'rev', rev, 'body', ARGV[2], 'created', created)
if tonumber(ARGV[4]) > 0 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
else
  redis.call('ZADD', KEYS[3], '+inf', ARGV[5])
end
return rev
