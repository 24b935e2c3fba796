#!lua
-- Gives a leadership up if this incarnation holds it at this term.
-- KEYS[1] lead  KEYS[2] term   ARGV[1] incarnation  ARGV[2] term
-- Returns 1 when released, else 0. Cost: O(1).
if redis.call('GET', KEYS[1]) == ARGV[1]
   and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
