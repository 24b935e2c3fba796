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
-- Returns one reply per operation: co_enter's or co_release's, or the
-- error that stopped that one operation (a broken key of one chat, say),
-- which fails it alone as its own script would: the others still run.
local now = co_now()
local out = {}
for i = 0, (#ARGV - 5) / 4 - 1 do
  H, Q = KEYS[2 * i + 1], KEYS[2 * i + 2]
  local a = 6 + 4 * i
  local ok, r
  if ARGV[a] == 'e' then
    ok, r = pcall(co_enter_op, now, ARGV[1], ARGV[a + 1], ARGV[2], ARGV[3],
                  ARGV[4], ARGV[5], ARGV[a + 2], ARGV[a + 3])
  elseif ARGV[a] == 'r' then
    ok, r = pcall(co_release_op, now, ARGV[1], ARGV[a + 1], ARGV[3],
                  ARGV[5], ARGV[a + 2], ARGV[a + 3])
  else
    ok, r = false, 'unknown operation ' .. tostring(ARGV[a])
  end
  if ok then
    out[i + 1] = r
  elseif type(r) == 'table' and r.err then
    out[i + 1] = r
  else
    out[i + 1] = {err = tostring(r)}
  end
end
return out
