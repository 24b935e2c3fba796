#!lua
--@include durable_common
-- Renews a holder's heartbeat, drops expired records, and claims records
-- that are free or held by a holder whose heartbeat lapsed, in arrival
-- order (keys: see durable_record.lua).
--
--   p:{durable:inbound}:hb    zset  holder -> heartbeat expiry (server ms)
--
-- KEYS[1] rec  KEYS[2] open  KEYS[3] exp  KEYS[4] hb
-- ARGV[1] holder  ARGV[2] lease ms  ARGV[3] limit  ARGV[4] max attempts
-- Returns { claimed, dropped, corrupted }: claimed and dropped are flat
-- lists of id, key, message, seq, attempts (dropped: given up, held by
-- the caller without a new attempt); corrupted lists the ids of
-- records that are not journal records (taken out of the open set).
-- An attempt count past 2^32 - 1 is damaged (the caller holds 32 bits).
-- Cost: O(open records scanned, at most 1000) + O(expired, at most 1000).
local now = dj_now()
local me = ARGV[1]
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), me)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
dj_sweep(now, 1000)
local limit = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local claimed, dropped, corrupted, n = {}, {}, {}, 0

-- Claims record `id` (decoded as `r`) for `me`. A record that decodes but
-- cannot be written back (an extra field of 1e999, which cjson reads as
-- infinity and refuses to write) is set aside as corrupted: the error
-- would abort the script after the records before it were taken, every
-- beat, with a reply nobody reads.
local function claim_one(id, r)
  local list = claimed
  if r.a >= max_attempts then
    -- Held until the caller reported it and confirms it (which drops its
    -- message): a caller that never heard this reply, or died first,
    -- leaves it to the next one, which reports it again.
    list = dropped
  else
    r.a = r.a + 1
  end
  r.st = 0
  r.h = me
  local ok, v = pcall(cjson.encode, r)
  if not ok then
    redis.call('ZREM', KEYS[2], id)
    corrupted[#corrupted + 1] = id
    return
  end
  if list == claimed then n = n + 1 end
  list[#list + 1] = id
  list[#list + 1] = r.k
  list[#list + 1] = r.m
  list[#list + 1] = string.format('%d', tonumber(r.s))
  list[#list + 1] = string.format('%d', r.a)
  redis.call('HSET', KEYS[1], id, v)
end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, 999)) do
  if n >= limit then break end
  local v = redis.call('HGET', KEYS[1], id)
  -- Past its TTL but not swept yet (the sweep takes at most 1000 a call,
  -- oldest first): dropped as the sweep would, never run again.
  local exp = redis.call('ZSCORE', KEYS[3], id)
  if exp and tonumber(exp) <= now then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  elseif not v then
    redis.call('ZREM', KEYS[2], id)
  else
    local ok, r = pcall(cjson.decode, v)
    -- Every field the claim passes on is checked: one bad record must not
    -- make the whole reply unreadable after the good ones were taken. An
    -- open record is held (0) or free (1); any other state would sit in
    -- the open set unclaimed, unreported, until it expired.
    if not ok or type(r) ~= 'table' or (r.st ~= 0 and r.st ~= 1)
       or not dj_count(r.a) or r.a > 4294967295 or type(r.h) ~= 'string'
       or type(r.k) ~= 'string' or type(r.m) ~= 'string'
       or not dj_count(tonumber(r.s)) then
      redis.call('ZREM', KEYS[2], id)
      corrupted[#corrupted + 1] = id
    elseif r.st == 1 or (r.st == 0 and r.h ~= me
                         and not redis.call('ZSCORE', KEYS[4], r.h)) then
      claim_one(id, r)
    end
  end
end
return { claimed, dropped, corrupted }
