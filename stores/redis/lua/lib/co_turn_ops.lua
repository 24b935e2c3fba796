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
-- Cost: O(1); a retry O(queue length). Each redis.call costs about as
-- much as a small command's own work, so the paths make as few as they
-- can: the uncontended turn, on every turn's path, is three (one read of
-- H, the queue's length, one write: the ticket counter with the grant);
-- a queued one three too (the read, the ticket counter, the push), its
-- blocker being the holder that read found. The keys' expiry costs a
-- PEXPIRE only once per quarter ttl (co_keep). The one read asks for
-- what these paths need; the holder's ticket and previous holder only
-- when the request turns out to hold the turn already (a retry).
local function co_enter_op(now, inc, req, lease, ttl, rep, chan, key, retry)
  local dl, fence, last, seq, x, oinc, oreq =
    unpack(redis.call('HMGET', H, 'o_dl', 'fence', 'last', 'seq', 'x',
                      'o_inc', 'o_req'))
  if dl and tonumber(dl) <= now then
    -- An expired holder is replaced first (rare): H changed, read it again.
    co_expire(now, chan, key)
    dl, fence, last, seq, x, oinc, oreq =
      unpack(redis.call('HMGET', H, 'o_dl', 'fence', 'last', 'seq', 'x',
                        'o_inc', 'o_req'))
  end
  if dl and oinc == inc and oreq == req then
    local h = redis.call('HMGET', H, 'o_tk', 'o_prev')
    co_keep(now, ttl, x)
    return {1, tonumber(h[1]), tonumber(fence), h[2], tonumber(dl), now}
  end
  if retry == '1' then
    local e, tk = co_find(inc, req)
    if e then
      co_keep(now, ttl, x)
      return {0, tonumber(tk), now, co_blocker()}
    end
  end
  local tk = tonumber(seq or '0') + 1
  if not dl and redis.call('LLEN', Q) == 0 then
    -- As co_grant, with what the read above already knows. The queue is
    -- empty, so it does not exist and has no expiry to keep; H's expiry
    -- (co_keep) goes with the grant's write.
    local nf = math.max(tonumber(fence or '0') + 1, now * 1024)
    local prev = last or ''
    local deadline = now + tonumber(lease)
    local w = {'seq', co_int(tk), 'fence', co_int(nf), 'o_inc', inc,
               'o_rep', rep, 'o_req', req, 'o_tk', co_int(tk),
               'o_dl', co_int(deadline), 'o_prev', prev}
    local stale = co_stale(now, ttl, x)
    if stale then
      w[#w + 1] = 'x'
      w[#w + 1] = co_int(now + tonumber(ttl))
    end
    redis.call('HSET', H, unpack(w))
    if stale then redis.call('PEXPIRE', H, ttl) end
    return {1, tk, nf, prev, deadline, now}
  end
  redis.call('HSET', H, 'seq', co_int(tk))
  if not dl then co_grant_next(now, '', chan, key) end
  local queued = redis.call('RPUSH', Q, co_int(tk) .. ' ' .. inc .. ' '
                            .. req .. ' ' .. lease .. ' ' .. rep)
  co_keep(now, ttl, x, queued == 1)
  -- The holder read above is still the one in the way; without one, the
  -- grant just made (or the queue's head) is.
  return {0, tk, now, dl and oinc or co_blocker()}
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
  local o = redis.call('HMGET', H, 'o_inc', 'fence', 'o_dl', 'o_rep', 'x')
  local released, g = 0, nil
  if o[1] == inc and o[2] == fence and tonumber(o[3]) > now then
    released = 1
    local queued
    g, queued = co_pass(now, o[4] or '', tonumber(o[2]), chan, key, handed)
    if not queued then
      -- Nobody waits: the chat is idle from now on, and its keys may be
      -- forgotten once x has passed. This turn's enter or its last
      -- renewal, less than a lease ago (a turn not renewed within its
      -- lease was lost, not released), left at least three quarters of a
      -- ttl of it, so H lives on for most of a ttl without one more
      -- PEXPIRE, and the next enter keeps it. The queue does not exist.
      return {released, now}
    end
  elseif o[1] and tonumber(o[3]) <= now then
    g = co_expire(now, chan, key)
  elseif not o[1] then
    g = co_grant_next(now, '', chan, key)
  end
  co_keep(now, ttl, o[5])
  if g and g[1] == inc then
    return {released, now, g[2], tonumber(g[3]), g[4], g[5], g[6]}
  end
  return {released, now}
end
