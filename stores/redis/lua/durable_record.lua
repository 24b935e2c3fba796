#!lua
--@include durable_common
-- Records an inbound message in the durable journal unless its id is known.
--
--   p:{durable:inbound}:rec   hash  id -> {"k":key,"m":message,"s":seq,
--                                          "h":holder,"st":state,"a":attempts}
--                                    state 0 held, 1 free, 2 done (tombstone)
--   p:{durable:inbound}:open  zset  id -> seq, for held and free records
--   p:{durable:inbound}:exp   zset  id -> expiry (server ms)
--   p:{durable:inbound}:seq   string arrival counter
--
-- KEYS[1] rec  KEYS[2] open  KEYS[3] exp  KEYS[4] seq
-- ARGV[1] id  ARGV[2] chat key  ARGV[3] message JSON  ARGV[4] holder
-- ARGV[5] ttl ms
-- Returns the record's seq, or 0 when the id is known (a duplicate).
-- Cost: O(log n); every 8th call also drops up to 16 expired records.
--
-- The beat's sweep (durable_claim.lua) is bounded per call, so at a
-- sustained arrival rate above that bound per beat the journal would
-- outgrow the retry window. This sweep keeps up with any rate: up to two
-- expired records dropped per record written.
local now = dj_now()
local e = redis.call('ZSCORE', KEYS[3], ARGV[1])
if e and tonumber(e) > now then return 0 end
local seq = redis.call('INCR', KEYS[4])
if seq % 8 == 0 then dj_sweep(now, 16) end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({k = ARGV[2], m = ARGV[3],
  s = seq, h = ARGV[4], st = 0, a = 1}))
redis.call('ZADD', KEYS[2], seq, ARGV[1])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
return seq
