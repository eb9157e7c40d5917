-- Floodgate refund: give back what one admitted call consumed, when the request it
-- admitted was refused after all (its in-flight limit was full, or the edge had
-- already answered 503 when the call's late reply arrived). The exact inverse of
-- the writes of token_bucket.lua and limiter.lua, and safe whatever happened to
-- the buckets since: a refund never leaves a bucket with more room than it would
-- have had without the refunded call.
--
-- KEYS[i]           bucket i of the refunded call (only buckets it consumed)
-- ARGV[1]           the instant the refunded call decided at (its reply's now, µs)
-- ARGV[4i-2]        the algorithm of bucket i: t, f, l or c (shadow buckets alike)
-- ARGV[4i-1..4i+1]  t: cost µs, the bucket's full_at before the call consumed
--                      (its decision's full_at less the cost; 0: unknown), 0
--                   f, c: period µs, cost, 0
--                   l: period µs, cost, the count the call read (its entries were
--                      named "<now>:<count + j>", j = 1..cost)
--                   d, m (calendar quotas): 0, cost, 0
--                   k (credits): cost, the as_of the call wrote, 0
--
-- Returns {the number of buckets given something back}.
--   t: full_at moves back by the cost (GCRA consumptions commute), less the
--      refill the bucket would have wasted had the call not consumed: without
--      it, the bucket was full from the base on, so every µs elapsed past the base
--      is one fewer to give back (as lua/lease_return.lua reckons); a bucket full
--      by then is deleted (an absent key is a full bucket).
--   f, c: the window's count drops by the cost, if the window is still the one the
--      call counted in (a later window never saw it).
--   l: the call's own entries are removed.
--   d, m: as f, in the calendar window (UTC day or month) the call counted in.
--   k: the credits go back if the count is still the one the call wrote to (the
--      same as_of: no refill since, which would have replaced it anyway).
-- Corrupt or foreign values are left alone.

local MAX_WINDOW = 34560000000000
local MAX_INSTANT = 4503599627370496
local MAX_LIMIT = 1000000000

local n = #KEYS
if n == 0 or #ARGV ~= 4 * n + 1 then
  return redis.error_reply('ERR floodgate: expected 1 + 4 x #KEYS arguments')
end
local at = tonumber(ARGV[1])
if not (at and at >= 0 and at <= MAX_INSTANT and at % 1 == 0) then
  return redis.error_reply('ERR floodgate: ARGV[1] must be microseconds in 0..2^52')
end

local function whole(x, lo, hi)
  return x ~= nil and x % 1 == 0 and x >= lo and x <= hi
end

-- #include calendar
-- the window a calendar quota counted in: the UTC day it starts on (a day, or the
-- 1st of its month)
local function calendar_window(code, t)
  if code == 'd' then return idiv(t, DAY) end
  return idiv(monthly(t, 1), DAY)
end

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local changed = 0
for i = 1, n do
  local code = ARGV[4 * i - 2]
  local a, b, c = tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1])
  if code == 't' then
    if not (whole(a, 1, MAX_WINDOW + 1) and whole(b, 0, MAX_INSTANT)) then
      return redis.error_reply('ERR floodgate: bad cost or base for KEYS[' .. i .. ']')
    end
    local owed = a
    if b > 0 and b < now then owed = a - (now - b) end
    local raw = redis.pcall('GET', KEYS[i])
    if owed > 0 and type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
      local full_at = tonumber(raw) - owed
      if full_at <= now then
        redis.call('DEL', KEYS[i])
      else
        redis.call('SET', KEYS[i], string.format('%d', full_at), 'KEEPTTL')
      end
      changed = changed + 1
    end
  elseif code == 'f' or code == 'c' or code == 'l' then
    if not (whole(a, 1, MAX_WINDOW) and whole(b, 1, MAX_LIMIT) and whole(c, 0, MAX_LIMIT)) then
      return redis.error_reply('ERR floodgate: bad period, cost or count for KEYS[' .. i .. ']')
    end
    local w = (at - math.fmod(at, a)) / a
    if code == 'l' then
      local removed = 0
      for first = 1, b, 1000 do -- unpack takes a bounded number of values
        local members = {}
        for j = first, math.min(b, first + 999) do
          members[#members + 1] = string.format('%d:%d', at, c + j)
        end
        local r = redis.pcall('ZREM', KEYS[i], unpack(members))
        if type(r) == 'number' then removed = removed + r end
      end
      if removed > 0 then changed = changed + 1 end
    else
      local raw = redis.pcall('GET', KEYS[i])
      if type(raw) == 'string' then
        if code == 'f' then
          local rw, rc = string.match(raw, '^(%d+):(%d+)$')
          if rw and #rw <= 16 and #rc <= 10 and tonumber(rw) == w then
            local count = math.max(0, tonumber(rc) - b)
            redis.call('SET', KEYS[i], string.format('%d:%d', w, count), 'KEEPTTL')
            changed = changed + 1
          end
        else
          local rw, rcur, rprev = string.match(raw, '^(%d+):(%d+):(%d+)$')
          if rw and #rw <= 16 and #rcur <= 10 and #rprev <= 10 and tonumber(rw) == w then
            local count = math.max(0, tonumber(rcur) - b)
            redis.call('SET', KEYS[i], string.format('%d:%d:%s', w, count, rprev), 'KEEPTTL')
            changed = changed + 1
          end
        end
      end
    end
  elseif code == 'd' or code == 'm' then
    if not (a == 0 and whole(b, 1, MAX_LIMIT)) then
      return redis.error_reply('ERR floodgate: bad cost for KEYS[' .. i .. ']')
    end
    local w = calendar_window(code, at)
    local raw = redis.pcall('GET', KEYS[i])
    if type(raw) == 'string' then
      local rw, rc = string.match(raw, '^(%d+):(%d+)$')
      if rw and #rw <= 16 and #rc <= 10 and tonumber(rw) == w then
        redis.call('SET', KEYS[i], string.format('%d:%d', w, math.max(0, tonumber(rc) - b)), 'KEEPTTL')
        changed = changed + 1
      end
    end
  elseif code == 'k' then
    if not (whole(a, 0, 1000000000000) and whole(b, 0, MAX_INSTANT)) then
      return redis.error_reply('ERR floodgate: bad cost or as_of for KEYS[' .. i .. ']')
    end
    local raw = redis.pcall('GET', KEYS[i])
    if type(raw) == 'string' then
      local rr, ra = string.match(raw, '^(%d+):(%d+)$')
      if rr and #rr <= 13 and #ra <= 16 and tonumber(ra) == b then
        redis.call('SET', KEYS[i], string.format('%d:%d', tonumber(rr) + a, b), 'KEEPTTL')
        changed = changed + 1
      end
    end
  else
    return redis.error_reply('ERR floodgate: unknown algorithm for KEYS[' .. i .. ']')
  end
end
return {changed}
