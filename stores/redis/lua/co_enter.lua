#!lua
--@include co_common
--@include co_turn_ops
-- Takes a ticket for a request and grants the turn at once when nobody
-- holds or waits for the chat (see co_enter_op).
--
-- KEYS[1] H  KEYS[2] Q  (see lib/co_common.lua)
-- ARGV[1] incarnation  ARGV[2] request id  ARGV[3] lease ms  ARGV[4] ttl ms
-- ARGV[5] replica id   ARGV[6] grant channel prefix  ARGV[7] chat key
-- ARGV[8] '1' on a retry (the reply of an earlier call was lost)
return co_enter_op(co_now(), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
                   ARGV[6], ARGV[7], ARGV[8])
