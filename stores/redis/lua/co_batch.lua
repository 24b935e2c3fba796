#!lua
--@include co_common
--@include co_turn_ops
-- Runs several enters and releases of one incarnation in one call, in
-- order, each exactly as co_enter or co_release would alone (one server
-- clock reading for all). One round trip and one script start for the
-- lot: under load that is most of what a turn costs the server.
--
-- KEYS: H and Q of each operation, in order (a chat may come twice)
-- ARGV[1] incarnation  ARGV[2] lease ms  ARGV[3] ttl ms  ARGV[4] replica id
-- ARGV[5] grant channel prefix; then four per operation:
--   'e', request id, chat key, '1' on a retry     (an enter)
--   'r', fence, chat key, what is handed on       (a release)
-- Returns one reply per operation: co_enter's or co_release's.
-- An error stops the script where it is: the operations before it are
-- done, the rest are not; the caller treats every one as a lost reply
-- (each is safe to repeat).
local now = co_now()
local out = {}
for i = 0, (#ARGV - 5) / 4 - 1 do
  H, Q = KEYS[2 * i + 1], KEYS[2 * i + 2]
  local a = 6 + 4 * i
  if ARGV[a] == 'e' then
    out[i + 1] = co_enter_op(now, ARGV[1], ARGV[a + 1], ARGV[2], ARGV[3],
                             ARGV[4], ARGV[5], ARGV[a + 2], ARGV[a + 3])
  else
    out[i + 1] = co_release_op(now, ARGV[1], ARGV[a + 1], ARGV[3], ARGV[5],
                               ARGV[a + 2], ARGV[a + 3])
  end
end
return out
