#!lua
-- Migration: writes one hash record (and its index entry) in the target
-- layout, keeping the source's remaining TTL.
-- KEYS[1] record hash  KEYS[2] its index (absent when ARGV[4] is "-")
-- ARGV[1] mode: "keep" (an existing record wins), "replace", or "token"
--   (schedules: replace when absent, or when the source's "token" field is
--   greater; the record written keeps the greater token)
-- ARGV[2] index member  ARGV[3] remaining TTL in ms, or 0 for none
-- ARGV[4] index score: "0", "exp" (expiry in server ms, +inf without TTL)
--   or "-" (no index)
-- ARGV[5..] field/value pairs
-- Returns 1 when written, 0 when the target's record was kept.
-- Cost: O(fields + log n).
local mode = ARGV[1]
local exists = redis.call('EXISTS', KEYS[1]) == 1
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
if exists and mode == 'keep' then return 0 end
if exists and mode == 'token' then
  local theirs = tonumber(redis.call('HGET', KEYS[1], 'token') or '0') or 0
  local ours = 0
  for i = 1, #fields, 2 do
    if fields[i] == 'token' then ours = tonumber(fields[i + 1]) or 0 end
  end
  if ours <= theirs then return 0 end
end
if exists and mode == 'replace' then
  -- An overwritten schedule still never loses its greater token.
  local theirs = tonumber(redis.call('HGET', KEYS[1], 'token') or '')
  if theirs then
    for i = 1, #fields, 2 do
      if fields[i] == 'token' and (tonumber(fields[i + 1]) or 0) < theirs then
        fields[i + 1] = string.format('%d', theirs)
      end
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
if ARGV[4] == '0' then
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
elseif ARGV[4] == 'exp' then
  if ttl > 0 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
  else
    redis.call('ZADD', KEYS[2], '+inf', ARGV[2])
  end
end
return 1
