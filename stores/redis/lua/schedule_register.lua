#!lua
-- Registers a durable task (see schedule_store::register_task).
--
--   schedule hash: spec, next, token, owner, until, claimed, done, deleted,
--                  updated (times in Unix ms, from the caller's clock)
--
-- KEYS[1] schedule hash  KEYS[2] schedule index (zset, score 0)
-- ARGV[1] id  ARGV[2] spec  ARGV[3] first run  ARGV[4] now
-- Returns the hash as a flat field/value array. Cost: O(log n).
-- A damaged hash (a field missing, a number that is not one) is returned
-- untouched: the caller's read names the field, and what it still holds
-- (its token, its tombstone) is not written over.
local h = KEYS[1]
if redis.call('EXISTS', h) == 1 then
  local f = redis.call('HMGET', h, 'spec', 'next', 'token', 'owner', 'until',
                       'claimed', 'done', 'deleted', 'updated')
  -- (Numbers of at most 18 digits: they fit the reader's 64 bits.)
  for i = 1, 9 do
    local v = f[i]
    if not v or (i ~= 1 and i ~= 4 and not string.match(v, '^%-?%d+$'))
       or (i == 3 and not string.match(v, '^%d+$'))
       or (i ~= 1 and i ~= 4 and #string.gsub(v, '^%-', '') > 18) then
      return redis.call('HGETALL', h)
    end
  end
  -- Live as the reader reads it: deleted is a number, 0.
  if tonumber(f[8]) == 0 and f[1] == ARGV[2] then
    return redis.call('HGETALL', h)
  end
end
local token = redis.call('HGET', h, 'token') or '0'
-- A run under way (a live claim of a record that is not deleted) keeps its
-- lease, so no new claim overlaps it; its token moves on, so its renewals
-- and its commit (on the old spec's calendar) are refused.
local owner = redis.call('HGET', h, 'owner')
if owner and owner ~= '' and tonumber(redis.call('HGET', h, 'deleted')) == 0
   and tonumber(redis.call('HGET', h, 'until')) > tonumber(ARGV[4]) then
  redis.call('HINCRBY', h, 'token', 1)
  redis.call('HSET', h, 'spec', ARGV[2], 'next', ARGV[3], 'done', 0,
             'updated', ARGV[4])
else
  redis.call('HSET', h, 'spec', ARGV[2], 'next', ARGV[3], 'token', token,
             'owner', '', 'until', 0, 'claimed', 0, 'done', 0, 'deleted', 0,
             'updated', ARGV[4])
end
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return redis.call('HGETALL', h)
