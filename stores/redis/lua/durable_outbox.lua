#!lua
-- Takes sends of the outbox, refusing a stale holder; several per call
-- (the backend sends in one call what was issued while the previous call
-- was in flight).
--
--   p:{durable:outbox}:sent   zset  send id -> expiry (server ms)
--   p:{durable:outbox}:fence  hash  chat key -> highest fence that sent
--   p:{durable:outbox}:fexp   zset  chat key -> expiry of its fence
--   p:{durable:outbox}:by     hash  send id -> its writer
--
-- KEYS[1] sent  KEYS[2] fence  KEYS[3] fexp  KEYS[4] by
-- ARGV: five per send: send id, chat key, fence, writer, ttl ms; or, to
-- take a send back (it failed, or its claim's reply was lost), send id,
-- '', '0', writer, 'forget': removed only when that writer wrote it (an
-- entry of another attempt may be a send that was made). A ttl with an
-- 'r' ahead of it records a send already made (written ahead of it): its
-- id is kept even when fenced, so a replay skips it rather than send
-- twice. Returns per send, in order: 1 (send), 0 (already sent), -1
-- (fenced: a higher fence sent), or an error reply naming a damaged
-- fence; per forget, 1 when the entry was removed, else 0.
-- Cost: O(log n) per send; in about one call of 8 also O(expired, at most
-- 100).
--
-- This runs for every send, so the usual path of one is kept to five
-- commands (HGET, ZADD NX, HSET by, HSET, ZADD) after the call's TIME:
-- ZADD NX both checks the send id and takes it, the fence is written only
-- when it changes (a turn's later sends skip it), and a sender without
-- coordination (fence 0) writes none. An entry or a fence past its expiry
-- counts as absent whether or not a sweep removed it yet, so the sweeps
-- only reclaim memory. A call of one send sweeps when the server's
-- millisecond clock is a multiple of 8 (about one call in 8) and can drop
-- 100 entries of each kind, more than the calls between two sweeps write;
-- a call of n > 1 sends always sweeps, up to 100 + 2n of each kind.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = math.floor(#ARGV / 5)
if n > 1 or now % 8 == 0 then
  local limit = 100 + 2 * n
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                                 'LIMIT', 0, limit)) do
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[4], id)
  end
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now,
                                'LIMIT', 0, limit)) do
    redis.call('HDEL', KEYS[2], k)
    redis.call('ZREM', KEYS[3], k)
  end
end
-- A send made (written ahead) over another writer's live entry: both
-- believe the entry is theirs, and either may take it back, though the
-- made send must stay recorded. With no writer nobody's take-back removes
-- it.
local function protect(id, writer)
  if redis.call('HGET', KEYS[4], id) ~= writer then
    redis.call('HDEL', KEYS[4], id)
  end
end

local function take(id, key, fence, writer, ttl)
  local made = string.sub(ttl, 1, 1) == 'r'
  if made then ttl = string.sub(ttl, 2) end
  local mine = tonumber(fence)
  local f = tonumber(redis.call('HGET', KEYS[2], key) or '0')
  if not f then
    -- A damaged fence fails this send alone, before it writes anything:
    -- the batch's other sends stand.
    return {err = 'corrupted durable fence ' .. key}
  end
  if mine < f then
    local e = redis.call('ZSCORE', KEYS[3], key)
    if e and tonumber(e) > now then
      -- (The chat's fence stays.) A live entry stays as it is: it may be
      -- the later holder's real send, which this writer's take-back must
      -- not remove.
      if made then
        local x = redis.call('ZSCORE', KEYS[1], id)
        if not x or tonumber(x) <= now then
          redis.call('ZADD', KEYS[1], now + tonumber(ttl), id)
          redis.call('HSET', KEYS[4], id, writer)
        else
          protect(id, writer)
        end
      end
      return -1
    end
    f = 0
  end
  local until_ms = now + tonumber(ttl)
  if redis.call('ZADD', KEYS[1], 'NX', until_ms, id) == 0 then
    local e = redis.call('ZSCORE', KEYS[1], id)
    if tonumber(e) > now then
      if made then protect(id, writer) end
      return 0
    end
    redis.call('ZADD', KEYS[1], until_ms, id)
  end
  redis.call('HSET', KEYS[4], id, writer)
  if mine ~= f then redis.call('HSET', KEYS[2], key, fence) end
  if mine ~= 0 then redis.call('ZADD', KEYS[3], until_ms, key) end
  return 1
end

local out = {}
for i = 1, 5 * n, 5 do
  if ARGV[i + 4] == 'forget' then
    if redis.call('HGET', KEYS[4], ARGV[i]) == ARGV[i + 3] then
      redis.call('HDEL', KEYS[4], ARGV[i])
      out[#out + 1] = redis.call('ZREM', KEYS[1], ARGV[i])
    else
      out[#out + 1] = 0
    end
  else
    out[#out + 1] = take(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
                         ARGV[i + 4])
  end
end
return out
