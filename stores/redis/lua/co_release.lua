#!lua
--@include co_common
--@include co_turn_ops
-- Ends a turn held by this incarnation at this fence and grants the next
-- ticket, pushed to its replica (see co_release_op).
--
-- KEYS[1] H  KEYS[2] Q
-- ARGV[1] incarnation  ARGV[2] fence  ARGV[3] ttl ms
-- ARGV[4] grant channel prefix  ARGV[5] chat key
-- ARGV[6] what the holder hands to the next one ('' = nothing)
return co_release_op(co_now(), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
                     ARGV[6])
