#!lua
-- Deletes entries of a chat's log in the cluster:v1 layout (see
-- cl_log_append.lua): each entry leaves together with its item, so no item
-- is left without its entry. Every key is declared (the caller read the
-- members first), so while the slot moves Redis answers ASK or TRYAGAIN
-- before anything runs.
-- KEYS[1] the log zset  KEYS[2..n+1] the item keys of ARGV[2..n+1]
-- ARGV[1] a seq: the reply counts the entries up to it that remain
-- ARGV[2..n+1] members to delete (one already gone is skipped)
-- Returns how many entries up to ARGV[1] remain. Deleting a chat goes
-- oldest first in batches up to the newest entry seen when it began, so a
-- message appended meanwhile gets a greater seq and survives; trimming
-- deletes the oldest entries over the log's maximum length.
-- Cost: O(n log n).
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('DEL', KEYS[i])
  end
end
return redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[1])
