-- Floodgate token bucket: check and consume one or more buckets atomically.
--
-- Each bucket is ONE Redis string holding one integer: full_at, the instant
-- (microseconds since the Unix epoch) at which the bucket is full again (the GCRA
-- form of a token bucket; tokens(now) = capacity - max(0, full_at - now) / T).
-- The key expires exactly when the bucket is full, because a full bucket and an
-- absent key are the same thing: idle buckets cost nothing.
--
-- KEYS[i]    bucket i (under Redis Cluster all KEYS share a hash tag; see keys.rs)
-- ARGV[1]    now in microseconds, or "" to use Redis TIME (one clock for all edges)
-- ARGV[2i]   burst window of bucket i: capacity x T microseconds
-- ARGV[2i+1] cost of this request in bucket i: cost x T microseconds
--
-- Returns {admitted, now, full_at_1, ..., full_at_n}: 1 when every bucket had room
-- (all were then consumed) or 0 (nothing was written anywhere), the instant used,
-- and each bucket's state as read (0 = absent or unreadable = full). The caller
-- derives remaining, reset and retry-after from these with the pure twin of this
-- script (shared/src/bucket.rs), so no second round trip is ever needed.
--
-- Unreadable state (not 1-16 ASCII digits, another type, an instant beyond
-- now + 400 days) is a full bucket and is overwritten by the next admission.
-- All numbers stay below 2^53, so Lua's doubles compute them exactly.

local MAX_WINDOW = 34560000000000 -- 400 days in microseconds
local MAX_INSTANT = 4503599627370496 -- 2^52

local now = tonumber(ARGV[1])
if now == nil then
  if ARGV[1] ~= '' then
    return redis.error_reply('ERR floodgate: ARGV[1] must be microseconds or empty')
  end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 or now > MAX_INSTANT or now % 1 ~= 0 then
  return redis.error_reply('ERR floodgate: ARGV[1] is out of range')
end

local n = #KEYS
if n == 0 or #ARGV ~= 2 * n + 1 then
  return redis.error_reply('ERR floodgate: expected 1 + 2 x #KEYS arguments')
end

local reply = {1, now}
local next_full = {}
for i = 1, n do
  local burst = tonumber(ARGV[2 * i])
  local cost = tonumber(ARGV[2 * i + 1])
  if burst == nil or cost == nil or burst < 1 or burst > MAX_WINDOW
      or cost < 0 or cost > MAX_WINDOW + 1 or burst % 1 ~= 0 or cost % 1 ~= 0 then
    return redis.error_reply('ERR floodgate: bad burst or cost for KEYS[' .. i .. ']')
  end
  local full_at = 0
  local raw = redis.pcall('GET', KEYS[i])
  if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
    full_at = tonumber(raw)
    if full_at > now + MAX_WINDOW then full_at = 0 end
  end
  reply[i + 2] = full_at
  local base = full_at
  if base < now then base = now end
  if cost > 0 then next_full[i] = base + cost end
  if base + cost - now > burst then reply[1] = 0 end
end

if reply[1] == 1 then
  for i = 1, n do
    local full_at = next_full[i]
    if full_at then
      redis.call('SET', KEYS[i], string.format('%d', full_at),
        'PX', string.format('%d', math.ceil((full_at - now) / 1000)))
    end
  end
end
return reply
