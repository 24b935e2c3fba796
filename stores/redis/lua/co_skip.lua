#!lua
--@include co_common
-- Skips a dead incarnation in a chat: its turn and its queued tickets. The
-- caller saw its heartbeat gone (a heartbeat lives in another slot, so the
-- script cannot look itself).
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] the dead incarnation  ARGV[2] ttl ms
-- ARGV[3] grant channel prefix  ARGV[4] chat key
-- Returns 1 when something was skipped, else 0. Cost: O(queue length).
local now = co_now()
local skipped = 0
local o = redis.call('HMGET', KEYS[1], 'o_inc', 'o_rep')
if o[1] == ARGV[1] then
  co_clear(o[2])
  skipped = 1
end
if co_drop(ARGV[1]) > 0 then skipped = 1 end
if not redis.call('HGET', KEYS[1], 'o_inc') then
  co_grant_next(now, '', ARGV[3], ARGV[4])
end
if redis.call('EXISTS', KEYS[1]) == 1 then co_touch(ARGV[2]) end
return skipped
