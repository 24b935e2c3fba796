#!lua
-- Writes a checkpoint, unconditionally or as compare-and-set.
--
--   checkpoint hash: rev (integer), body (JSON), created (Unix ms)
--   revision key:    the last revision ever written; survives clears, so a
--                    revision is never handed out twice for a key
--
-- KEYS[1] checkpoint hash  KEYS[2] revision key
-- KEYS[3] (cluster:v1 layout only) bucket index (zset: member = checkpoint
--   key, score = expiry in Unix ms or +inf)
-- ARGV[1] "any", or the expected live revision (0 = no live checkpoint)
-- ARGV[2] body  ARGV[3] created_at for a new conversation (Unix ms)
-- ARGV[4] absolute expiry in Unix ms (ephemeral), or 0
-- ARGV[5] (with KEYS[3]) the checkpoint key
-- Returns the new revision, or nil when the expected revision differs; an
-- error naming KEYS[2] (or KEYS[1], for a live revision past it), before
-- anything is written, when the last revision is not one a Lua number
-- holds exactly with its successor (0 to 2^53-2: damaged), so a revision
-- is never handed out twice.
-- Cost: O(1); O(log n) with the index, plus up to 100 expired entries
-- pruned.
local function revision(v)
  local n = tonumber(v)
  if n == nil or n < 0 or n > 9007199254740990 or n ~= math.floor(n) then
    return nil
  end
  return n
end
local live = redis.call('EXISTS', KEYS[1]) == 1
local current = 0
if live then current = tonumber(redis.call('HGET', KEYS[1], 'rev')) or 0 end
if ARGV[1] ~= 'any' and tonumber(ARGV[1]) ~= current then return false end
local stored = redis.call('GET', KEYS[2]) or '0'
local last = revision(stored)
if not last then
  return redis.error_reply('checkpoint revision ' .. KEYS[2]
                           .. ' is damaged: "' .. stored
                           .. '" is not a revision')
end
if current > last then
  last = revision(current)
  if not last then
    return redis.error_reply('checkpoint ' .. KEYS[1] .. ' is damaged: its '
                             .. 'revision ' .. string.format('%.17g', current)
                             .. ' is not one')
  end
end
local rev = string.format('%d', last + 1)
redis.call('SET', KEYS[2], rev)
local created = ARGV[3]
if live then created = redis.call('HGET', KEYS[1], 'created') or created end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'rev', rev, 'body', ARGV[2], 'created', created)
if tonumber(ARGV[4]) > 0 then redis.call('PEXPIREAT', KEYS[1], ARGV[4]) end
if KEYS[3] then
  local score = '+inf'
  if tonumber(ARGV[4]) > 0 then score = ARGV[4] end
  redis.call('ZADD', KEYS[3], score, ARGV[5])
  -- Expired ephemeral checkpoints leave the index here, by the server's
  -- clock: no listing reads checkpoint indexes, and pruning only on a read
  -- would let them grow with every handover for good.
  -- At most 100 a write, so a write after a long quiet spell does not
  -- hold the server for a whole backlog; each write adds one entry.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now,
                          'LIMIT', 0, 100)
  if #gone > 0 then redis.call('ZREM', KEYS[3], unpack(gone)) end
end
return last + 1
