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
-- Cost: O(log n); in about one call of 8 also O(expired, at most 100).
--
-- This runs once per send, so the usual path is kept to five commands
-- (TIME, HGET, ZADD NX, HSET, ZADD): ZADD NX both checks the send id and
-- takes it, the fence is written only when it changes (a turn's later
-- sends skip it), and a sender without coordination (fence 0) writes none.
-- An entry or a fence past its expiry counts as absent whether or not a
-- sweep removed it yet, so the sweeps only reclaim memory: they run when
-- the server's millisecond clock is a multiple of 8 (about one call in 8)
-- and each can drop 100 entries of each kind, more than the calls between
-- two sweeps write.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now % 8 == 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                                 'LIMIT', 0, 100)) do
    redis.call('ZREM', KEYS[1], id)
  end
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now,
                                'LIMIT', 0, 100)) do
    redis.call('HDEL', KEYS[2], k)
    redis.call('ZREM', KEYS[3], k)
  end
end
local mine = tonumber(ARGV[3])
local f = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if mine < f then
  local e = redis.call('ZSCORE', KEYS[3], ARGV[2])
  if e and tonumber(e) > now then return -1 end
  f = 0
end
local until_ms = now + tonumber(ARGV[4])
if redis.call('ZADD', KEYS[1], 'NX', until_ms, ARGV[1]) == 0 then
  local e = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if tonumber(e) > now then return 0 end
  redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
end
if mine ~= f then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
if mine ~= 0 then redis.call('ZADD', KEYS[3], until_ms, ARGV[2]) end
return 1
