-- Shared by the co_* turn scripts; spliced in at build time where a script
-- includes it. Every such script gets
--   KEYS[1] H: the chat's hash          KEYS[2] Q: the chat's ticket queue
-- and the functions below work on the chat named by the locals H and Q
-- (KEYS[1] and KEYS[2] unless the script moves them: co_batch runs the
-- operations of several chats, one after the other).
--
-- H fields (all written as integers with co_int):
--   seq       last ticket handed out
--   fence     last fence granted: max(previous + 1, server ms * 1024), so it
--             keeps growing even after an idle chat's keys expired (see ttl
--             below) and were created again
--   last      replica id of the previous holder ('' or missing: unknown)
--   o_inc o_rep o_req o_tk o_dl o_prev
--             the holder: incarnation, replica id, request id, ticket,
--             deadline (server ms) and the previous holder it was told
-- Q entries (a list, oldest first):
--   "<ticket> <incarnation> <req> <lease ms> <replica id>"
--
-- Expiry: H's field x is a server time (ms) until which both keys live at
-- least. Every script that touches a chat makes sure at least three
-- quarters of the ttl the caller passes (far above the lease) are left of
-- it: when less is left it sets both keys' PEXPIRE to ttl and x to now +
-- ttl (co_keep), otherwise it writes nothing for expiry. A chat touched on
-- every turn then pays two PEXPIRE and one field per quarter ttl instead
-- of per script (a redis.call costs about as much as a small command's
-- own work). No script lowers the expiry (a refresh happens only when it
-- moves x later), so replicas with different leases, hence ttls, never
-- cut each other's margin; a queue created after x was written gets x as
-- its expiry. A release that leaves the chat idle touches nothing (see
-- co_release_op). A holder renews within its lease and a waiter polls
-- within it, each leaving at least three quarters of its own ttl (40
-- leases or more), so the keys of a chat with a live holder or waiter
-- never expire; only idle chats are forgotten.
--
-- Upgrading from scripts without x: those set the expiry to their own ttl
-- on every call, which can be less than x only when they use a shorter
-- ttl, i.e. a lease above 15 s (ttl = max(10 min, 40 leases)) that differs
-- from the new replicas'. Replicas with the same lease, or leases of 15 s
-- or less, mix safely.

-- A grant is pushed: PUBLISH on "<channel prefix><incarnation>" with
--   "<req> <ticket> <fence> <deadline> <now> <#prev> <prev><chat key>"
-- and, when a release grants with something handed over (co_pass), that
-- prefixed with "h<#handed> <handed>" (a reader that predates it fails to
-- parse the push and finds the grant by polling).

local H, Q = KEYS[1], KEYS[2]

local function co_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers beyond 1e14 must not reach Redis in Lua's %.14g notation.
local function co_int(n)
  return string.format('%d', n)
end

local function co_parse(e)
  return string.match(e, '^(%d+) (%S+) (%d+) (%d+) (.*)$')
end

-- Whether less than three quarters of `ttl` are left of x (H's field, nil
-- when unknown): then the keys' expiry is refreshed.
local function co_stale(now, ttl, x)
  return not x or tonumber(x) - now < tonumber(ttl) * 0.75
end

-- Keeps the chat's keys for at least three quarters of `ttl` from `now`,
-- given x as read by the script (see Expiry above): when less is left,
-- both keys expire `ttl` from now and x says so (which moves it later; a
-- missing H is not created). `qnew`: Q was just created, so it has no
-- expiry yet.
local function co_keep(now, ttl, x, qnew)
  if co_stale(now, ttl, x) then
    if redis.call('PEXPIRE', H, ttl) == 1 then
      redis.call('HSET', H, 'x', co_int(now + tonumber(ttl)))
    end
    redis.call('PEXPIRE', Q, ttl)
  elseif qnew then
    redis.call('PEXPIREAT', Q, x)
  end
end

-- Makes (inc, req, ticket) the holder for `lease` ms; returns its grant.
local function co_grant(now, inc, rep, req, tk, lease)
  local fence = math.max(tonumber(redis.call('HGET', H, 'fence') or '0') + 1,
                         now * 1024)
  local prev = redis.call('HGET', H, 'last') or ''
  local dl = now + lease
  redis.call('HSET', H, 'fence', co_int(fence), 'o_inc', inc,
             'o_rep', rep, 'o_req', req, 'o_tk', tk, 'o_dl', co_int(dl),
             'o_prev', prev)
  return {inc, req, tk, fence, prev, dl}
end

-- Grants the turn to the first queued ticket not of incarnation `skip` and
-- pushes the grant to its replica. Returns the grant, or nil.
local function co_grant_next(now, skip, chan, key)
  while true do
    local e = redis.call('LPOP', Q)
    if not e then return nil end
    local tk, inc, req, lease, rep = co_parse(e)
    if tk and inc ~= skip then
      local g = co_grant(now, inc, rep, req, tk, tonumber(lease))
      redis.call('PUBLISH', chan .. inc,
                 req .. ' ' .. tk .. ' ' .. co_int(g[4]) .. ' ' .. co_int(g[6])
                 .. ' ' .. co_int(now) .. ' ' .. #g[5] .. ' ' .. g[5] .. key)
      return g
    end
  end
end

-- Ends the current holding; the holder's replica becomes `last` (nil:
-- unknown).
local function co_clear(rep)
  redis.call('HSET', H, 'last', rep or '')
  redis.call('HDEL', H, 'o_inc', 'o_rep', 'o_req', 'o_tk', 'o_dl',
             'o_prev')
end

-- Ends a valid holding by replica `rep` at `fence` and grants the next
-- queued ticket in the same write (pushed to its replica, with `handed`
-- when not empty). Returns that grant and true, or nil and false when
-- nobody waits (the turn is free).
local function co_pass(now, rep, fence, chan, key, handed)
  local e = redis.call('LPOP', Q)
  while e do
    local tk, inc, req, lease, r = co_parse(e)
    if tk then
      local nf = math.max(fence + 1, now * 1024)
      local dl = now + tonumber(lease)
      redis.call('HSET', H, 'last', rep, 'fence', co_int(nf),
                 'o_inc', inc, 'o_rep', r, 'o_req', req, 'o_tk', tk,
                 'o_dl', co_int(dl), 'o_prev', rep)
      local msg = req .. ' ' .. tk .. ' ' .. co_int(nf) .. ' ' .. co_int(dl)
                  .. ' ' .. co_int(now) .. ' ' .. #rep .. ' ' .. rep .. key
      if handed and #handed > 0 then
        msg = 'h' .. #handed .. ' ' .. handed .. msg
      end
      redis.call('PUBLISH', chan .. inc, msg)
      return {inc, req, tk, nf, rep, dl}, true
    end
    e = redis.call('LPOP', Q)
  end
  co_clear(rep)
  return nil, false
end

-- Removes every queued ticket of incarnation `inc`; returns how many.
local function co_drop(inc)
  local n = 0
  for _, e in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    local tk, i = co_parse(e)
    if i == inc then
      n = n + redis.call('LREM', Q, 1, e)
    end
  end
  return n
end

-- Finds this request's queued entry: the entry and its ticket, or nil.
-- With `ahead` (a table), also lists there the other incarnations queued
-- before it, neither `inc` nor `holder`, in queue order, at most 8 (a
-- poll's turn_state::queued_ahead).
local function co_find(inc, req, ahead, holder)
  local seen = {}
  for _, e in ipairs(redis.call('LRANGE', Q, 0, -1)) do
    local tk, i, r = co_parse(e)
    if i == inc and r == req then return e, tk end
    if ahead and i and i ~= inc and i ~= holder and not seen[i]
       and #ahead < 8 then
      seen[i] = true
      ahead[#ahead + 1] = i
    end
  end
  return nil
end

-- A holder past its deadline loses the turn, and its incarnation's queued
-- tickets with it: it stopped renewing, so it is dead or frozen past its
-- lease. The next ticket is granted. Returns that grant, or nil.
local function co_expire(now, chan, key)
  local o = redis.call('HMGET', H, 'o_inc', 'o_dl', 'o_rep')
  if o[1] and tonumber(o[2]) <= now then
    -- Whether the expired holder ran its turn is unknown (a grant it never
    -- heard of, or one it gave up, expires the same way): `last` says
    -- unknown, so every next holder reads the store instead of resuming a
    -- conversation another replica may have moved on meanwhile.
    co_clear(nil)
    co_drop(o[1])
    return co_grant_next(now, o[1], chan, key)
  end
  return nil
end

-- Who is in the way of a waiting request: the holder, else the head.
local function co_blocker()
  local h = redis.call('HGET', H, 'o_inc')
  if h then return h end
  local e = redis.call('LINDEX', Q, 0)
  if e then
    local tk, i = co_parse(e)
    return i or ''
  end
  return ''
end
