#!lua
-- Marks a task deleted, keeping its hash and fencing token.
-- KEYS[1] schedule hash   ARGV[1] now
-- Returns 1 when a live record was removed, else 0. Cost: O(1).
if redis.call('HGET', KEYS[1], 'deleted') ~= '0' then return 0 end
redis.call('HSET', KEYS[1], 'deleted', 1, 'done', 0, 'owner', '', 'until', 0,
           'claimed', 0, 'updated', ARGV[1])
return 1
