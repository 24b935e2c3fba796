-- Shared by the journal scripts (keys: see durable_record.lua).

-- The server clock in milliseconds.
local function dj_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drops up to `limit` records whose expiry passed: rec, open and exp.
local function dj_sweep(now, limit)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now,
                                 'LIMIT', 0, limit)) do
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
end

-- Whether `v` is a count a record may hold (a whole number from 0 to 2^53,
-- which string.format('%d') writes exactly).
local function dj_count(v)
  return type(v) == 'number' and v >= 0 and v <= 9007199254740992
         and v == math.floor(v)
end
