-- The bodies of co_enter and co_release, shared with co_batch (which runs
-- several of them in one call). Spliced after co_common; each works on the
-- chat of H and Q at server time `now`, and returns its script's reply.

-- Takes a ticket for request `req` of incarnation `inc` (replica `rep`) and
-- grants the turn at once when nobody holds or waits for the chat. `lease`
-- and `ttl` in ms; `chan` the grant channel prefix; `key` the chat key;
-- `retry` '1' when the reply of an earlier call may have been lost.
-- Returns {1, ticket, fence, previous holder or '', deadline, now} when
-- granted; {0, ticket, now, blocker} when queued. A retry of a request
-- already granted or queued returns that grant or ticket again.
-- Cost: O(1); a retry O(queue length). The uncontended turn, on every
-- turn's path, is four commands: one read of H, one write (the ticket
-- counter with the grant), the queue's length and H's expiry. Each read
-- asks only for what it needs (a script's cost grows with every element a
-- reply carries): the holder's own fields only when there is one (o_dl is
-- set exactly while o_inc is).
local function co_enter_op(now, inc, req, lease, ttl, rep, chan, key, retry)
  local dl, fence, last, seq =
    unpack(redis.call('HMGET', H, 'o_dl', 'fence', 'last', 'seq'))
  if dl and tonumber(dl) <= now then
    -- An expired holder is replaced first (rare): H changed, read it again.
    co_expire(now, chan, key)
    dl, fence, last, seq =
      unpack(redis.call('HMGET', H, 'o_dl', 'fence', 'last', 'seq'))
  end
  if dl then
    local h = redis.call('HMGET', H, 'o_inc', 'o_req', 'o_tk', 'o_prev')
    if h[1] == inc and h[2] == req then
      co_touch(ttl)
      return {1, tonumber(h[3]), tonumber(fence), h[4], tonumber(dl), now}
    end
  end
  if retry == '1' then
    local e, tk = co_find(inc, req)
    if e then
      co_touch(ttl)
      return {0, tonumber(tk), now, co_blocker()}
    end
  end
  local tk = tonumber(seq or '0') + 1
  if not dl and redis.call('LLEN', Q) == 0 then
    -- As co_grant, with what the read above already knows. The queue is
    -- empty, so it does not exist and has no expiry to refresh.
    local nf = math.max(tonumber(fence or '0') + 1, now * 1024)
    local prev = last or ''
    local deadline = now + tonumber(lease)
    redis.call('HSET', H, 'seq', co_int(tk), 'fence', co_int(nf),
               'o_inc', inc, 'o_rep', rep, 'o_req', req,
               'o_tk', co_int(tk), 'o_dl', co_int(deadline), 'o_prev', prev)
    redis.call('PEXPIRE', H, ttl)
    return {1, tk, nf, prev, deadline, now}
  end
  redis.call('HSET', H, 'seq', co_int(tk))
  if not dl then co_grant_next(now, '', chan, key) end
  redis.call('RPUSH', Q, co_int(tk) .. ' ' .. inc .. ' ' .. req .. ' '
             .. lease .. ' ' .. rep)
  co_touch(ttl)
  return {0, tk, now, co_blocker()}
end

-- Ends a turn held by incarnation `inc` at `fence` and grants the next
-- ticket (pushed to its replica, with `handed` when not empty: what the
-- holder hands to the next one, pushed only with the grant this valid
-- release makes). `ttl` in ms, `chan` and `key` as for co_enter_op.
-- Returns {released (1/0), now} and, when the next holder is this same
-- incarnation, its grant after them: {.., req, ticket, fence, previous
-- holder, deadline}. Releasing a turn no longer held (expired, released
-- before) changes nothing of the current holder. Cost: O(1), O(queue
-- length) when an expired holder's tickets are dropped.
local function co_release_op(now, inc, fence, ttl, chan, key, handed)
  local o = redis.call('HMGET', H, 'o_inc', 'fence', 'o_dl', 'o_rep')
  local released, g = 0, nil
  if o[1] == inc and o[2] == fence and tonumber(o[3]) > now then
    released = 1
    local queued
    g, queued = co_pass(now, o[4] or '', tonumber(o[2]), chan, key, handed)
    if not queued then
      -- Nobody waits: the chat is idle from now on, and its keys may be
      -- forgotten a ttl after they were last touched. That was this
      -- turn's enter or its last renewal, less than a lease ago (a turn
      -- not renewed within its lease was lost, not released), so H lives
      -- on for nearly a ttl without one more PEXPIRE, and the next enter
      -- refreshes it. The queue does not exist.
      return {released, now}
    end
  elseif o[1] and tonumber(o[3]) <= now then
    g = co_expire(now, chan, key)
  elseif not o[1] then
    g = co_grant_next(now, '', chan, key)
  end
  co_touch(ttl)
  if g and g[1] == inc then
    return {released, now, g[2], tonumber(g[3]), g[4], g[5], g[6]}
  end
  return {released, now}
end
