#!lua
-- Grants a chat's turn to a ticket when it is the next to serve.
--
--   owner hash: inc, replica, ticket, fence, deadline (server ms)
--   last hash:  replica (previous holder), fence (last fence granted)
--
-- KEYS[1] seq  KEYS[2] tix  KEYS[3] serving  KEYS[4] owner  KEYS[5] last
-- ARGV[1] incarnation  ARGV[2] replica id  ARGV[3] ticket  ARGV[4] lease ms
-- Returns {1, fence, previous holder or '', deadline} when granted;
-- {0, incarnation} when the holder or an earlier ticket of that incarnation
-- blocks (the caller checks its heartbeat, then may call co_skip);
-- {-1} when the ticket is no longer queued. Cost: O(skipped tickets).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local o = redis.call('HMGET', KEYS[4], 'inc', 'replica', 'ticket', 'deadline')
local serving = tonumber(redis.call('GET', KEYS[3]) or '1')
local held = false
if o[1] then
  if tonumber(o[4]) > now then
    held = true
  else
    -- The holder's lease ran out: its turn is lost.
    redis.call('HSET', KEYS[5], 'replica', o[2])
    serving = math.max(serving, tonumber(o[3]) + 1)
    redis.call('DEL', KEYS[4])
    redis.call('SET', KEYS[3], serving)
  end
end
if redis.call('HGET', KEYS[2], ARGV[3]) ~= ARGV[1] then return {-1} end
if held then return {0, o[1]} end
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
while serving <= seq and not redis.call('HGET', KEYS[2], serving) do
  serving = serving + 1
end
redis.call('SET', KEYS[3], serving)
if serving ~= tonumber(ARGV[3]) then
  return {0, redis.call('HGET', KEYS[2], serving)}
end
local fence = redis.call('HINCRBY', KEYS[5], 'fence', 1)
local prev = redis.call('HGET', KEYS[5], 'replica') or ''
local deadline = now + tonumber(ARGV[4])
redis.call('HDEL', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[4], 'inc', ARGV[1], 'replica', ARGV[2],
           'ticket', ARGV[3], 'fence', fence, 'deadline', deadline)
return {1, fence, prev, deadline}
