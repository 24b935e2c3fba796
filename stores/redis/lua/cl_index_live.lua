#!lua
-- Prunes an index scored by expiry with the server's clock and returns its
-- live members (checkpoint buckets, a user's data).
-- KEYS[1] index (zset: score = expiry in Unix ms, or +inf)
-- ARGV[1] a member prefix to keep ("" = all)
-- Returns the live members starting with ARGV[1] (in score order).
-- Cost: O(log n + pruned + members).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local all = redis.call('ZRANGE', KEYS[1], 0, -1)
if ARGV[1] == '' then return all end
local out = {}
local n = #ARGV[1]
for _, m in ipairs(all) do
  if string.sub(m, 1, n) == ARGV[1] then out[#out + 1] = m end
end
return out
