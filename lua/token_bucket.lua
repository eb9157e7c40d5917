-- Floodgate token bucket: check and consume one or more buckets atomically.
--
-- Each bucket is ONE Redis string holding one integer: full_at, the instant
-- (microseconds since the Unix epoch) at which the bucket is full again (the GCRA
-- form of a token bucket; tokens(now) = capacity - max(0, full_at - now) / T).
-- Redis keeps it as an integer object (no string buffer). The key expires at most
-- one second after the bucket is full again, because a full bucket and an absent
-- key are the same thing: idle buckets cost nothing.
--
-- KEYS[i]    bucket i (under Redis Cluster all KEYS share a hash tag; see keys.rs)
-- KEYS[n+1]  optional (when #KEYS is one more than the buckets ARGV describes): the
--            records' revision counter (shared/src/changes.rs), read in the same MGET
--            as the buckets and returned last, so the caller learns of a changed
--            configuration or key at no extra command; never under Redis Cluster
--            (another slot)
-- KEYS[n+2]  optional, only with KEYS[n+1]: the API key record the request is
--            decided for (a key this edge has not read yet), read in the same
--            MGET: when it is absent the call decides and writes nothing and
--            returns {4, now} (no such key: no bucket is minted for it); when
--            present its value is returned last, after rev, so the edge learns
--            the record with the decision at no extra command (it gives the
--            decision back when the record does not admit the request as
--            guessed). Never merged, never under Redis Cluster
-- ARGV[1]    the clock: "" to use Redis TIME (one clock for all edges); "<T" to use
--            TIME but only while TIME <= T (µs), else the call changes nothing and
--            returns {2, now} (stale: the caller has given up on it by then); or an
--            instant in µs to decide at (tests, replays)
--            Either form may end in "xN" (N in 2..1000): N identical requests,
--            decided one after another at the same instant (see "Merged" below)
-- ARGV[2i]   burst window of bucket i: capacity x T microseconds (1 .. 400 days)
-- ARGV[2i+1] cost of this request in bucket i: cost x T microseconds (0 = peek)
--
-- Returns {admitted, now, full_at_1, ..., full_at_n[, rev[, record]]}: 1 when every bucket had room
-- (all were then consumed) or 0 (nothing was written anywhere), the instant used,
-- and each bucket's state as read (0 = absent or unreadable = full). The caller
-- derives remaining, reset and retry-after from these with the pure twin of this
-- script (shared/src/bucket.rs), so no second round trip is ever needed. With the
-- revision key, rev is the counter's value, or -1 when it is missing or not a number.
--
-- Merged ("xN"): the edge sends identical concurrent requests of a busy bucket
-- as ONE call. At one instant the j-th of them fits iff every bucket has room for
-- j costs (a denial consumes nothing and nothing refills in between), so the
-- first k fit and the rest do not: the reply is {k, now, full_at_1, ..., [rev]}
-- with the state as the FIRST of them read it, and {-1, now} when stale. The
-- caller splits it into the replies N single calls would have had
-- (shared/src/script/merge.rs); one call, one TIME, one MGET, one SET per bucket.
--
-- Commands run: TIME, one MGET of every key, one SET per admitted bucket (what a
-- bill counts besides the EVALSHA itself; a denial writes nothing).
--
-- Unreadable state (not 1-16 ASCII digits, another type, an instant beyond
-- now + 400 days) is a full bucket and is overwritten by the next admission.
-- All numbers stay below 2^53, so Lua's doubles compute them exactly.

local MAX_WINDOW = 34560000000000 -- 400 days in microseconds
-- #include clock
local EXPIRY_STEP = 1000000 -- keys expire on whole seconds (see phase 2)

local n = (#ARGV - 1) / 2
if n < 1 or n % 1 ~= 0 or #KEYS < n or #KEYS > n + 2 then
  return redis.error_reply('ERR floodgate: expected 1 + 2 x #KEYS arguments')
end
local with_rev = #KEYS >= n + 1
local with_record = #KEYS == n + 2

local now = ARGV[1]
local count = 1
local merged = false
local x = string.find(now, 'x', 1, true)
if x then
  count = tonumber(string.sub(now, x + 1))
  if count == nil or count < 2 or count > 1000 or count % 1 ~= 0 then
    return redis.error_reply('ERR floodgate: ARGV[1] may end in xN, N in 2..1000')
  end
  merged = true
  now = string.sub(now, 1, x - 1)
  if with_record then
    return redis.error_reply('ERR floodgate: a record is read by one request, not merged')
  end
end
local stale
now, stale = clock(now)
if now == nil then
  return redis.error_reply(BAD_CLOCK)
end
if stale then
  if merged then return {-1, now} end
  return {2, now}
end

-- Phase 1: read every bucket and decide. Nothing is written unless all have room.
-- (The reply is built with room for four buckets: growing a Lua table costs more
-- than the rest of the arithmetic. Slots past n are cleared before returning.)
local reply = {count, now, 0, 0, 0, 0}
local raws = redis.call('MGET', unpack(KEYS))
if with_record and type(raws[n + 2]) ~= 'string' then
  return {4, now}
end
for i = 1, n do
  local burst = tonumber(ARGV[2 * i])
  local cost = tonumber(ARGV[2 * i + 1])
  if not (burst and cost and burst >= 1 and burst <= MAX_WINDOW and cost >= 0
      and cost <= MAX_WINDOW + 1 and burst % 1 == 0 and cost % 1 == 0) then
    return redis.error_reply('ERR floodgate: bad burst or cost for KEYS[' .. i .. ']')
  end
  local full_at = 0
  local raw = raws[i]
  if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
    full_at = tonumber(raw)
    if full_at > now + MAX_WINDOW then full_at = 0 end
  end
  reply[i + 2] = full_at
  if full_at < now then full_at = now end
  if cost > 0 then
    -- how many of the requests fit, one after another: j fit while
    -- full_at + j x cost - now <= burst
    local fit = math.floor((burst - (full_at - now)) / cost)
    if fit < reply[1] then reply[1] = math.max(fit, 0) end
  elseif full_at - now > burst then
    reply[1] = 0
  end
end

-- Phase 2: consume every bucket. A key expires at its full_at rounded up to the
-- next whole second (EXPIRY_STEP): by then the bucket is full, i.e. the same as an
-- absent key. So the expiry in force is known from the value read, and a write that
-- stays within the same second keeps it (KEEPTTL) instead of setting it again, which
-- costs Redis more than the rest of the write.
if reply[1] > 0 then
  for i = 1, n do
    local cost = tonumber(ARGV[2 * i + 1]) * reply[1]
    if cost > 0 then
      local old = reply[i + 2]
      local full_at = old
      if full_at < now then full_at = now end
      full_at = full_at + cost
      local expiry = math.ceil(full_at / EXPIRY_STEP) * EXPIRY_STEP
      if old > 0 and expiry == math.ceil(old / EXPIRY_STEP) * EXPIRY_STEP then
        redis.call('SET', KEYS[i], string.format('%d', full_at), 'KEEPTTL')
      else
        redis.call('SET', KEYS[i], string.format('%d', full_at),
          'PX', string.format('%d', math.ceil((expiry - now) / 1000)))
      end
    end
  end
end
for i = n + 3, 6 do reply[i] = nil end
if with_rev then
  local rev = raws[n + 1]
  if type(rev) == 'string' and #rev <= 16 and string.find(rev, '^%d+$') and tonumber(rev) < 9007199254740992 then
    reply[n + 3] = tonumber(rev)
  else
    reply[n + 3] = -1
  end
end
if with_record then
  reply[n + 4] = raws[n + 2]
end
return reply
