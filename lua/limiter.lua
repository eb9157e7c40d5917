-- Floodgate limiter: every algorithm, several buckets, one atomic call.
--
-- Used when a request's policies are not all enforced token buckets (those take
-- token_bucket.lua, the hot path). Reads every bucket, decides, and writes only
-- when every enforced bucket has room: a denial consumes nothing anywhere.
-- Shadow buckets are decided like the others but never deny: they are consumed
-- when the request is admitted and they have room, so they count what enforcing
-- them would have done.
--
-- KEYS[i]        bucket i (under Redis Cluster all KEYS share a hash tag)
-- ARGV[1]        the clock: "" to use Redis TIME (one clock for all edges); "<T" to use
--                TIME but only while TIME <= T (µs), else the call changes nothing and
--                returns {2, now} (stale: the caller has given up on it by then); or an
--                instant in µs to decide at (tests, replays)
-- ARGV[4i-2]     algorithm of bucket i: t (token bucket), f (fixed window),
--                l (sliding-window log), c (sliding-window counter), d / m (a
--                calendar quota: per UTC day / month); prefixed with s for shadow
--                (st, sf, sl, sc, sd, sm); or k (an API key's credits, never shadow,
--                at most one per call: see below)
-- ARGV[4i-1..4i+1] t: burst window µs, cost µs, 0
--                f, l, c: period µs, limit, cost (tokens)
--                d, m: 0, limit, cost
--                k: the record's count, the instant (µs) it stands as of, cost
--
-- Credits (shared/src/credits.rs): the code is k (no refill), kd:<amount> (set to
-- amount at 00:00 UTC daily) or km<day>:<amount> (on day 1-31 of each month, the
-- month's last day when shorter). The live count is a string "<remaining>:<as_of>";
-- absent or unreadable, it is the record's count as of the record's instant; "moved"
-- (the key's identity changed, and its live count with it: edge/src/admin.rs) makes
-- the call return {3, now}, deciding nothing: the caller's record is stale. Due
-- refills are applied, then the request fits when cost <= remaining. Admitted:
-- the count is spent and written, expiring at the next refill instant (when an
-- absent count and the stored one are the same thing) or never without a refill.
-- Calendar windows (shared/src/calendar.rs) count like a fixed window whose index is
-- the UTC day its window starts on; the key expires a second after the reset.
--
-- Returns {admitted, now, then three integers per bucket}, the state as read
-- ({2, now}: stale; {3, now}: the credits moved, see above):
--   t: full_at (0 = absent), 0, 0
--   f: the count of the current window, 0, 0
--   l: the count within the window; the instant of the entry whose expiry makes
--      room for this request (0 when it fits or never can); the newest instant
--   c: the current window's count and the previous window's, seen from now; 0
--   d, m: the count of the current calendar window, 0, 0
--   k: the live count and its as_of as read (before any refill), 0
-- The caller derives each decision with the pure twins (shared/src/bucket.rs and
-- shared/src/windows.rs). All integers stay below 2^53; the sliding counter's
-- weight is computed in doubles with the same operations as its twin.

local MAX_WINDOW = 34560000000000 -- 400 days in microseconds
-- #include clock
local MAX_LIMIT = 1000000000
local EXPIRY_STEP = 1000000
local SLACK_MS = 1000 -- window keys outlive their use by a second (clock skew between edges)

local n = #KEYS
if n == 0 or #ARGV ~= 4 * n + 1 then
  return redis.error_reply('ERR floodgate: expected 1 + 4 x #KEYS arguments')
end

local now, stale = clock(ARGV[1])
if now == nil then
  return redis.error_reply(BAD_CLOCK)
end
if stale then
  return {2, now}
end

local function whole(x, lo, hi)
  return x ~= nil and x % 1 == 0 and x >= lo and x <= hi
end

-- #include calendar
local MAX_CREDITS = 1000000000000

-- the window index and the time elapsed in it, exactly (fmod is exact)
local function window(period)
  local elapsed = math.fmod(now, period)
  return (now - elapsed) / period, elapsed
end

local reply = {1, now}
local fits, codes, windows, wrong = {}, {}, {}, {}
local credit = nil -- {index, remaining after the spend, as_of, next refill or nil}

-- Phase 1: read and decide.
for i = 1, n do
  local code = ARGV[4 * i - 2]
  local a, b, c = tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1])
  local shadow = string.sub(code, 1, 1) == 's'
  if shadow then code = string.sub(code, 2) end
  codes[i] = code
  local v1, v2, v3, ok = 0, 0, 0, false
  if code == 't' then
    if not (whole(a, 1, MAX_WINDOW) and whole(b, 0, MAX_WINDOW + 1)) then
      return redis.error_reply('ERR floodgate: bad burst or cost for KEYS[' .. i .. ']')
    end
    local raw = redis.pcall('GET', KEYS[i])
    if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
      v1 = tonumber(raw)
      if v1 > now + MAX_WINDOW then v1 = 0 end
    end
    local full_at = v1
    if full_at < now then full_at = now end
    ok = full_at + b - now <= a
  elseif code == 'f' or code == 'l' or code == 'c' then
    if not (whole(a, 1, MAX_WINDOW) and whole(b, 1, MAX_LIMIT) and whole(c, 0, MAX_LIMIT)) then
      return redis.error_reply('ERR floodgate: bad period, limit or cost for KEYS[' .. i .. ']')
    end
    if code == 'f' then
      local w = window(a)
      windows[i] = w
      local raw = redis.pcall('GET', KEYS[i])
      if type(raw) == 'string' then
        local rw, rc = string.match(raw, '^(%d+):(%d+)$')
        if rw and #rw <= 16 and #rc <= 10 and tonumber(rw) == w then v1 = tonumber(rc) end
      end
      ok = v1 + c <= b
    elseif code == 'l' then
      local trimmed = redis.pcall('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - a)
      if type(trimmed) == 'table' and trimmed.err then
        wrong[i] = true -- another type: an empty log, replaced on admission
      else
        v1 = redis.call('ZCARD', KEYS[i])
        if v1 + c > b and c <= b then
          local e = redis.call('ZRANGE', KEYS[i], v1 + c - b - 1, v1 + c - b - 1, 'WITHSCORES')
          v2 = tonumber(e[2])
        end
        if v1 > 0 then
          v3 = tonumber(redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')[2])
        end
      end
      ok = v1 + c <= b
    else
      local w, elapsed = window(a)
      windows[i] = w
      local raw = redis.pcall('GET', KEYS[i])
      if type(raw) == 'string' then
        local rw, rcur, rprev = string.match(raw, '^(%d+):(%d+):(%d+)$')
        if rw and #rw <= 16 and #rcur <= 10 and #rprev <= 10 then
          rw = tonumber(rw)
          if rw == w then
            v1, v2 = tonumber(rcur), tonumber(rprev)
          elseif rw == w - 1 then
            v2 = tonumber(rcur)
          end
        end
      end
      ok = v2 * ((a - elapsed) / a) + v1 + c <= b
    end
  elseif code == 'd' or code == 'm' then
    if not (a == 0 and whole(b, 1, MAX_LIMIT) and whole(c, 0, MAX_LIMIT)) then
      return redis.error_reply('ERR floodgate: bad limit or cost for KEYS[' .. i .. ']')
    end
    local start, reset
    if code == 'd' then start, reset = daily(now) else start, reset = monthly(now, 1) end
    windows[i] = {start / DAY, reset}
    local raw = redis.pcall('GET', KEYS[i])
    if type(raw) == 'string' then
      local rw, rc = string.match(raw, '^(%d+):(%d+)$')
      if rw and #rw <= 16 and #rc <= 10 and tonumber(rw) == start / DAY then v1 = tonumber(rc) end
    end
    ok = v1 + c <= b
  elseif string.sub(code, 1, 1) == 'k' and not shadow and credit == nil then
    local interval, day, amount = nil, 1, 0
    if code ~= 'k' then
      local rday, ramount
      if string.sub(code, 2, 2) == 'd' then
        interval, ramount = 'd', string.match(code, '^kd:(%d+)$')
      else
        interval = 'm'
        rday, ramount = string.match(code, '^km(%d+):(%d+)$')
        day = tonumber(rday)
      end
      amount = tonumber(ramount)
      if not (whole(amount, 1, MAX_CREDITS) and whole(day, 1, 31)) then
        return redis.error_reply('ERR floodgate: bad refill for KEYS[' .. i .. ']')
      end
    end
    if not (whole(a, 0, MAX_CREDITS) and whole(b, 0, MAX_INSTANT) and whole(c, 0, MAX_CREDITS)) then
      return redis.error_reply('ERR floodgate: bad credits, origin or cost for KEYS[' .. i .. ']')
    end
    v1, v2 = a, b
    local raw = redis.pcall('GET', KEYS[i])
    if raw == 'moved' then
      -- the key's credits moved to another identity's key (its identity changed):
      -- the caller's record is stale; nothing is decided, nothing written
      return {3, now}
    end
    if type(raw) == 'string' then
      local rr, ra = string.match(raw, '^(%d+):(%d+)$')
      if rr and #rr <= 13 and #ra <= 16 and tonumber(rr) <= MAX_CREDITS and tonumber(ra) <= MAX_INSTANT then
        v1, v2 = tonumber(rr), tonumber(ra)
      end
    end
    -- refills due since as_of: the count is the amount as of the last one
    local remaining, as_of, reset = v1, v2, nil
    if interval ~= nil then
      local last
      if interval == 'd' then last, reset = daily(now) else last, reset = monthly(now, day) end
      if now > as_of and last > as_of then remaining, as_of = amount, last end
    end
    credit = {i, remaining - c, as_of, reset}
    ok = c <= remaining
  else
    return redis.error_reply('ERR floodgate: unknown algorithm for KEYS[' .. i .. ']')
  end
  reply[3 * i] = v1
  reply[3 * i + 1] = v2
  reply[3 * i + 2] = v3
  fits[i] = ok
  if not ok and not shadow then reply[1] = 0 end
end

-- Phase 2: consume every bucket that has room (all enforced ones do).
if reply[1] == 1 then
  for i = 1, n do
    local code = codes[i]
    local a, b, c = tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1])
    if fits[i] and code == 't' and b > 0 then
      local old = reply[3 * i]
      local full_at = old
      if full_at < now then full_at = now end
      full_at = full_at + b
      local expiry = math.ceil(full_at / EXPIRY_STEP) * EXPIRY_STEP
      if old > 0 and expiry == math.ceil(old / EXPIRY_STEP) * EXPIRY_STEP then
        redis.call('SET', KEYS[i], string.format('%d', full_at), 'KEEPTTL')
      else
        redis.call('SET', KEYS[i], string.format('%d', full_at),
          'PX', string.format('%d', math.ceil((expiry - now) / 1000)))
      end
    elseif fits[i] and code == 'f' and c > 0 then
      local w = windows[i]
      local ttl = math.ceil(((w + 1) * a - now) / 1000) + SLACK_MS
      redis.call('SET', KEYS[i], string.format('%d:%d', w, reply[3 * i] + c), 'PX', string.format('%d', ttl))
    elseif fits[i] and code == 'l' and c > 0 then
      if wrong[i] then redis.call('DEL', KEYS[i]) end
      local count = reply[3 * i]
      for j = 1, c do
        redis.call('ZADD', KEYS[i], now, string.format('%d:%d', now, count + j))
      end
      redis.call('PEXPIRE', KEYS[i], string.format('%d', math.ceil(a / 1000) + SLACK_MS))
    elseif fits[i] and code == 'c' and c > 0 then
      local w = windows[i]
      local ttl = math.ceil(((w + 2) * a - now) / 1000) + SLACK_MS
      redis.call('SET', KEYS[i], string.format('%d:%d:%d', w, reply[3 * i] + c, reply[3 * i + 1]),
        'PX', string.format('%d', ttl))
    elseif fits[i] and (code == 'd' or code == 'm') and c > 0 then
      local w = windows[i]
      local ttl = math.ceil((w[2] - now) / 1000) + SLACK_MS
      redis.call('SET', KEYS[i], string.format('%d:%d', w[1], reply[3 * i] + c), 'PX', string.format('%d', ttl))
    elseif credit ~= nil and credit[1] == i and c > 0 then
      local value = string.format('%d:%d', credit[2], credit[3])
      if credit[4] == nil then
        redis.call('SET', KEYS[i], value)
      else
        redis.call('SET', KEYS[i], value, 'PX', string.format('%d', math.ceil((credit[4] - now) / 1000)))
      end
    end
  end
end
return reply
