#!lua
-- Takes or renews a leader lease.
--   lease hash: owner, until (Unix ms, caller's clock), token (grows per holder)
-- KEYS[1] lease hash
-- ARGV[1] owner  ARGV[2] now  ARGV[3] TTL in ms
-- Returns the lease token, or nil while another owner holds it. Cost: O(1).
local f = redis.call('HMGET', KEYS[1], 'owner', 'until', 'token')
local owner = f[1] or ''
local now = tonumber(ARGV[2])
if owner ~= ARGV[1] then
  if owner ~= '' and tonumber(f[2]) > now then return false end
  redis.call('HINCRBY', KEYS[1], 'token', 1)
  redis.call('HSET', KEYS[1], 'owner', ARGV[1])
end
redis.call('HSET', KEYS[1], 'until', now + tonumber(ARGV[3]))
return tonumber(redis.call('HGET', KEYS[1], 'token'))
