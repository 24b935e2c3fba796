#!lua
-- Confirms (done) or releases (free) a journal record held by a holder
-- (keys: see durable_record.lua).
--
-- KEYS[1] rec  KEYS[2] open
-- ARGV[1] id  ARGV[2] holder  ARGV[3] "done" | "free"
-- Returns 1 when the holder held it, else 0; an error reply naming the id
-- when the stored record is not a journal record. Cost: O(log n).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local ok, r = pcall(cjson.decode, v)
if not ok or type(r) ~= 'table' or type(r.st) ~= 'number' then
  return redis.error_reply('corrupted durable record ' .. ARGV[1])
end
if r.st ~= 0 or r.h ~= ARGV[2] then return 0 end
r.h = ''
if ARGV[3] == 'done' then
  r.st = 2
  r.m = ''
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  r.st = 1
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(r))
return 1
