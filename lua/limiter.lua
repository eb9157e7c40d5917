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
--                l (sliding-window log), c (sliding-window counter); prefixed
--                with s for shadow (st, sf, sl, sc)
-- ARGV[4i-1..4i+1] t: burst window µs, cost µs, 0
--                f, l, c: period µs, limit, cost (tokens)
--
-- Returns {admitted, now, then three integers per bucket}, the state as read:
--   t: full_at (0 = absent), 0, 0
--   f: the count of the current window, 0, 0
--   l: the count within the window; the instant of the entry whose expiry makes
--      room for this request (0 when it fits or never can); the newest instant
--   c: the current window's count and the previous window's, seen from now; 0
-- The caller derives each decision with the pure twins (shared/src/bucket.rs and
-- shared/src/windows.rs). All integers stay below 2^53; the sliding counter's
-- weight is computed in doubles with the same operations as its twin.

local MAX_WINDOW = 34560000000000 -- 400 days in microseconds
local MAX_INSTANT = 4503599627370496 -- 2^52
local MAX_LIMIT = 1000000000
local EXPIRY_STEP = 1000000
local SLACK_MS = 1000 -- window keys outlive their use by a second (clock skew between edges)

local n = #KEYS
if n == 0 or #ARGV ~= 4 * n + 1 then
  return redis.error_reply('ERR floodgate: expected 1 + 4 x #KEYS arguments')
end

local now = ARGV[1]
local expires = nil
if string.sub(now, 1, 1) == '<' then
  expires = tonumber(string.sub(now, 2))
  if expires == nil or expires < 0 or expires > MAX_INSTANT or expires % 1 ~= 0 then
    return redis.error_reply('ERR floodgate: ARGV[1] must be empty, <microseconds or microseconds in 0..2^52')
  end
  now = ''
end
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  if expires ~= nil and now > expires then
    return {2, now}
  end
else
  now = tonumber(now)
  if now == nil or now < 0 or now > MAX_INSTANT or now % 1 ~= 0 then
    return redis.error_reply('ERR floodgate: ARGV[1] must be empty, <microseconds or microseconds in 0..2^52')
  end
end

local function whole(x, lo, hi)
  return x ~= nil and x % 1 == 0 and x >= lo and x <= hi
end

-- the window index and the time elapsed in it, exactly (fmod is exact)
local function window(period)
  local elapsed = math.fmod(now, period)
  return (now - elapsed) / period, elapsed
end

local reply = {1, now}
local fits, codes, windows, wrong = {}, {}, {}, {}

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
    end
  end
end
return reply
