#!lua
--@include durable_common
-- Renews a holder's heartbeat, drops expired records, and claims records
-- that are free or held by a holder whose heartbeat lapsed, in arrival
-- order (keys: see durable_record.lua).
--
--   p:{durable:inbound}:hb    zset  holder -> heartbeat expiry (server ms)
--   p:{durable:inbound}:ccur  string the seq where the last scan past the
--                             first 500 open records stopped
--
-- KEYS[1] rec  KEYS[2] open  KEYS[3] exp  KEYS[4] hb
-- KEYS[5] (optional) ccur: the seq where the last scan past the head
--   stopped
-- ARGV[1] holder  ARGV[2] lease ms  ARGV[3] limit  ARGV[4] max attempts
-- Returns { claimed, dropped, corrupted }: claimed and dropped are flat
-- lists of id, key, message, seq, attempts (dropped: given up, held by
-- the caller without a new attempt); corrupted lists the ids of
-- records that are not journal records (taken out of the open set).
-- Cost: O(open records scanned, at most 1000) + O(expired, at most 1000).
local now = dj_now()
local me = ARGV[1]
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), me)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
dj_sweep(now, 1000)
local limit = tonumber(ARGV[3])
local max_attempts = tonumber(ARGV[4])
local claimed, dropped, corrupted, n = {}, {}, {}, 0
local function visit(id)
  local v = redis.call('HGET', KEYS[1], id)
  if not v then
    redis.call('ZREM', KEYS[2], id)
    return
  end
  local ok, r = pcall(cjson.decode, v)
  -- Every field the claim passes on is checked: one bad record must not
  -- make the whole reply unreadable after the good ones were taken.
  if not ok or type(r) ~= 'table' or type(r.st) ~= 'number'
     or not dj_count(r.a) or type(r.h) ~= 'string'
     or type(r.k) ~= 'string' or type(r.m) ~= 'string'
     or not dj_count(tonumber(r.s)) then
    redis.call('ZREM', KEYS[2], id)
    corrupted[#corrupted + 1] = id
  elseif r.st == 1 or (r.st == 0 and r.h ~= me
                       and not redis.call('ZSCORE', KEYS[4], r.h)) then
    local list = claimed
    if r.a >= max_attempts then
      -- Held until the caller reported it and confirms it (which
      -- drops its message): a caller that never heard this reply, or
      -- died first, leaves it to the next one, which reports it again.
      list = dropped
      r.st = 0
      r.h = me
    else
      r.a = r.a + 1
      r.st = 0
      r.h = me
      n = n + 1
    end
    list[#list + 1] = id
    list[#list + 1] = r.k
    list[#list + 1] = r.m
    list[#list + 1] = string.format('%d', tonumber(r.s))
    list[#list + 1] = string.format('%d', r.a)
    redis.call('HSET', KEYS[1], id, cjson.encode(r))
  end
end
-- The oldest open records first, in arrival order.
local head = redis.call('ZRANGE', KEYS[2], 0, 499, 'WITHSCORES')
for i = 1, #head, 2 do
  if n >= limit then break end
  visit(head[i])
end
-- Past them, 500 a call from where the last call stopped (KEYS[5]): a
-- live replica's backlog at the head would otherwise hide a dead one's
-- records behind it for as long as it lasts.
if KEYS[5] and n < limit and #head == 1000 then
  local from = tonumber(redis.call('GET', KEYS[5]) or '0') or 0
  local floor = tonumber(head[#head])
  if from < floor then from = floor end
  local deep = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', from),
                          '+inf', 'WITHSCORES', 'LIMIT', 0, 500)
  local reached, whole = from, true
  for i = 1, #deep, 2 do
    if n >= limit then
      whole = false
      break
    end
    visit(deep[i])
    reached = tonumber(deep[i + 1])
  end
  if whole and #deep < 1000 then
    redis.call('DEL', KEYS[5]) -- the end: from the head again
  else
    redis.call('SET', KEYS[5], string.format('%d', reached))
  end
end
return { claimed, dropped, corrupted }
