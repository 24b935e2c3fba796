#!lua
--@include durable_common
-- Records and settles inbound journal records, several per call: the
-- backend sends in one call what its callers issued while the previous
-- call was in flight, so a busy bot pays one script call for many records.
--
--   p:{durable:inbound}:rec   hash  id -> {"k":key,"m":message,"s":seq,
--                                          "h":holder,"st":state,"a":attempts}
--                                    (seq: a decimal string; a number in
--                                    records written before)
--                                    state 0 held, 1 free, 2 done (tombstone)
--   p:{durable:inbound}:open  zset  id -> seq, for held and free records
--   p:{durable:inbound}:exp   zset  id -> expiry (server ms)
--   p:{durable:inbound}:seq   string arrival counter
--
-- KEYS[1] rec  KEYS[2] open  KEYS[3] exp  KEYS[4] seq
-- ARGV: operations one after the other, each a letter and its arguments:
--   r id key message-JSON holder ttl-ms   record the message unless its id
--                                         is known: its seq, or 0 (a
--                                         duplicate)
--   d id holder                           confirm (done) a record the
--   f id holder                           holder holds, or release it
--   u id holder                           (free; u: giving back the
--                                         attempt of a message it never
--                                         handled): 1, or 0 when not held
-- Returns one reply per operation, in order. A stored record that is not a
-- journal record fails only its own operation (an error reply naming its
-- id in that place); the others run.
-- Cost: O(log n) per operation; every 8th record also drops up to 16
-- expired records.
--
-- The beat's sweep (durable_claim.lua) is bounded per call, so at a
-- sustained arrival rate above that bound per beat the journal would
-- outgrow the retry window. The records' sweep keeps up with any rate: up
-- to two expired records dropped per record written.
local now = dj_now()

local function record(id, key, message, holder, ttl)
  local e = redis.call('ZSCORE', KEYS[3], id)
  if e and tonumber(e) > now then return 0 end
  local ok, seq = pcall(redis.call, 'INCR', KEYS[4])
  if not ok then
    -- Fails this record alone: the batch's earlier writes stand, and their
    -- callers must hear they landed.
    return {err = 'corrupted durable journal counter ' .. KEYS[4]}
  end
  if seq < 1 or seq > 9007199254740991 then
    return {err = 'corrupted durable journal counter ' .. KEYS[4] .. ': '
                  .. string.format('%.0f', seq) .. ' is not a sequence number'}
  end
  if seq % 8 == 0 then dj_sweep(now, 16) end
  -- The seq as a decimal string: cjson writes numbers with 14 digits, and
  -- from 1e14 two records would share one seq.
  redis.call('HSET', KEYS[1], id, cjson.encode({k = key, m = message,
    s = string.format('%d', seq), h = holder, st = 0, a = 1}))
  redis.call('ZADD', KEYS[2], seq, id)
  redis.call('ZADD', KEYS[3], now + tonumber(ttl), id)
  return seq
end

local function settle(id, holder, done, unhandled)
  local v = redis.call('HGET', KEYS[1], id)
  if not v then return 0 end
  local ok, r = pcall(cjson.decode, v)
  if not ok or type(r) ~= 'table' or type(r.st) ~= 'number' then
    return {err = 'corrupted durable record ' .. id}
  end
  if r.st ~= 0 or r.h ~= holder then return 0 end
  r.h = ''
  if done then
    r.st = 2
    r.m = ''
  else
    r.st = 1
    if unhandled and type(r.a) == 'number' and r.a > 0 then
      r.a = r.a - 1
    end
  end
  -- A field cjson read but cannot write (1e999 is read as infinity): this
  -- operation fails, naming the record, and the others of the call go on.
  local written, enc = pcall(cjson.encode, r)
  if not written then
    return {err = 'corrupted durable record ' .. id
                  .. ': cannot be written back (' .. tostring(enc) .. ')'}
  end
  redis.call('HSET', KEYS[1], id, enc)
  if done then redis.call('ZREM', KEYS[2], id) end
  return 1
end

local out = {}
local i = 1
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'r' then
    out[#out + 1] = record(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4],
                           ARGV[i + 5])
    i = i + 6
  elseif op == 'd' or op == 'f' or op == 'u' then
    out[#out + 1] = settle(ARGV[i + 1], ARGV[i + 2], op == 'd', op == 'u')
    i = i + 3
  else
    return redis.error_reply('durable_journal: unknown operation ' .. op)
  end
end
return out
