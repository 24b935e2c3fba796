#!lua
-- Takes a lock if free and hands out the next fence.
-- KEYS[1] lock key (value: token, with a TTL)  KEYS[2] fence counter
-- ARGV[1] token  ARGV[2] TTL in ms
-- Returns the fence, or nil when the lock is held. A fence counter that
-- cannot give one (not an integer, at its limit, or not positive after
-- the increment: damaged) gives an error naming it, and the lock is not
-- left taken by a token nobody has. Cost: O(1).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. fence.err)
  end
  if fence < 1 then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' is damaged: '
                             .. fence .. ' is not a fence')
  end
  return fence
end
return false
