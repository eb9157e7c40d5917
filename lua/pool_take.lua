-- Floodgate regional pool: decide a request's bounded buckets from what a region
-- holds, in ONE regional round trip, atomically.
--
-- A pool lives in a regional Redis next to the edges of one region: a hash per
-- bucket whose fields are chunks of tokens leased from the global bucket
-- (lua/lease_take.lua; field = the global lease's member, value =
-- "<tokens>:<expires_at>" in µs of this Redis' clock, a chunk expiring before its
-- global lease does), and the region's credit in use: "<used>:<uncharged>",
-- requests admitted on credit and not yet released, of which the last ones are
-- not yet charged to the global bucket (no TTL). Credit charged while the global
-- bucket had room is released; charged into debt, it stays used (no more credit
-- for that key) until a later charge finds the debt repaid. The credit lets a
-- region admit
-- the first requests of a key it holds no tokens for at once; the region's credit
-- cap per key times the number of regions, plus the tokens the global Redis lets
-- out on leases, is the policy's max_overshoot.
--
-- KEYS[i]        the pool of bucket i
-- KEYS[n+i]      the refill lock of bucket i (a plain key with a TTL)
-- KEYS[2n+i]     the credit in use of bucket i
-- ARGV[1]        the clock: "" for Redis TIME, "<T" for TIME but only while TIME <= T
--                (a later call changes nothing and returns {2, now}), or µs
-- ARGV[3i-1]     cost of bucket i in tokens (1 ..)
-- ARGV[3i]       low-water mark of bucket i: below it after this call, the caller
--                is asked to refill (0: never)
-- ARGV[3i+1]     the region's credit cap for bucket i (0: no credit)
-- ARGV[3n+2]     the refill lock's lifetime in ms (1 ..)
--
-- A bucket admits from its live chunks (those expiring first first), or else on
-- credit while the credit in use stays within the cap; admitted = 1 when every
-- bucket admits (then all are spent), 0 otherwise (nothing is spent anywhere).
--
-- Returns {admitted, now, then per bucket: tokens left, refill, unconfirmed, k, then
-- k x 3 integers}: refill = 1 when this caller took bucket i's refill lock (one
-- refill at a time per region) — taken when the tokens left fall below the
-- low-water mark or credit is in use — and must then charge the `unconfirmed`
-- (uncharged) credit to the global bucket and retire the k spent chunks ({id,
-- tokens, base} of "<id>:<tokens>:<base>") with its take. Corrupt chunks count as
-- empty; a corrupt credit counter as all credit in use (credit is taken when in
-- use, so its refill rewrites the counter): nothing is ever minted.

local MAX_INSTANT = 4503599627370496
local n = #KEYS / 3
if n < 1 or n % 1 ~= 0 or #ARGV ~= 3 * n + 2 then
  return redis.error_reply('ERR floodgate: pool take expects 3 x n keys and 2 + 3 x n arguments')
end
local now = ARGV[1]
local expires = nil
if string.sub(now, 1, 1) == '<' then
  expires = tonumber(string.sub(now, 2))
  if expires == nil or expires < 0 or expires > MAX_INSTANT or expires % 1 ~= 0 then
    return redis.error_reply('ERR floodgate: ARGV[1] must be empty, <microseconds or microseconds')
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
    return redis.error_reply('ERR floodgate: ARGV[1] must be empty, <microseconds or microseconds')
  end
end
local lock_ms = tonumber(ARGV[3 * n + 2])
if not (lock_ms and lock_ms >= 1 and lock_ms % 1 == 0) then
  return redis.error_reply('ERR floodgate: bad refill lock lifetime')
end

-- Phase 1: read every pool, decide how each bucket would admit.
local pools, totals, credits, uncharges, by_credit = {}, {}, {}, {}, {}
local admitted = 1
for i = 1, n do
  local cost, low, cap = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not (cost and low and cap and cost >= 1 and low >= 0 and cap >= 0
      and cost % 1 == 0 and low % 1 == 0 and cap % 1 == 0) then
    return redis.error_reply('ERR floodgate: bad cost, low-water mark or credit for KEYS[' .. i .. ']')
  end
  local chunks, total, credit = {}, 0, 0
  local raw = redis.pcall('HGETALL', KEYS[i])
  if type(raw) == 'table' and not raw.err then
    for j = 1, #raw, 2 do
      local tokens, expiry = string.match(raw[j + 1], '^(%d+):(%d+)$')
      tokens, expiry = tonumber(tokens), tonumber(expiry)
      if tokens and expiry and expiry > now and tokens > 0 then
        chunks[#chunks + 1] = {raw[j], tokens, expiry}
        total = total + tokens
      else
        redis.call('HDEL', KEYS[i], raw[j])
      end
    end
  elseif type(raw) == 'table' then
    redis.call('DEL', KEYS[i]) -- another type: an empty pool
  end
  local uncharged = 0
  local c = redis.pcall('GET', KEYS[2 * n + i])
  if type(c) == 'string' then
    local u, x = string.match(c, '^(%d+):(%d+)$')
    if u and #u <= 15 and #x <= 15 and tonumber(x) <= tonumber(u) then
      credit, uncharged = tonumber(u), tonumber(x)
    else
      credit = cap -- corrupt: no credit until the next refill rewrites it
    end
  elseif type(c) == 'table' then
    credit = cap -- another type
  end
  table.sort(chunks, function(a, b) return a[3] < b[3] end)
  pools[i], totals[i], credits[i], uncharges[i] = chunks, total, credit, uncharged
  if total >= cost then
    by_credit[i] = false
  elseif credit + cost <= cap then
    by_credit[i] = true
  else
    admitted = 0
  end
end

-- Phase 2: spend (all or nothing), then hand out refill locks.
local reply = {admitted, now}
for i = 1, n do
  local cost, low = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local left, credit, uncharged = totals[i], credits[i], uncharges[i]
  if admitted == 1 and by_credit[i] then
    credit, uncharged = credit + cost, uncharged + cost
    redis.call('SET', KEYS[2 * n + i], string.format('%d:%d', credit, uncharged))
  elseif admitted == 1 then
    local due = cost
    for _, c in ipairs(pools[i]) do
      if due == 0 then break end
      local spend = math.min(due, c[2])
      due = due - spend
      if spend == c[2] then
        redis.call('HDEL', KEYS[i], c[1])
        redis.call('RPUSH', KEYS[i] .. ':spent', c[1])
        redis.call('LTRIM', KEYS[i] .. ':spent', -64, -1)
        redis.call('PEXPIRE', KEYS[i] .. ':spent', 60000)
      else
        redis.call('HSET', KEYS[i], c[1], string.format('%d:%d', c[2] - spend, c[3]))
      end
    end
    left = left - cost
  end
  local refill, unconfirmed = 0, 0
  if (left < low or credit > 0) and redis.call('SET', KEYS[n + i], '1', 'NX', 'PX', lock_ms) then
    refill, unconfirmed = 1, uncharged
  end
  reply[#reply + 1] = left
  reply[#reply + 1] = refill
  reply[#reply + 1] = unconfirmed
  local spent = {}
  if refill == 1 then
    local raw = redis.pcall('LRANGE', KEYS[i] .. ':spent', 0, -1)
    if type(raw) == 'table' and not raw.err then
      for _, m in ipairs(raw) do
        local id, tokens, base = string.match(m, '^(%d+):(%d+):(%d+)$')
        if id and #id <= 15 and #tokens <= 15 and #base <= 16 then
          spent[#spent + 1] = tonumber(id)
          spent[#spent + 1] = tonumber(tokens)
          spent[#spent + 1] = tonumber(base)
        end
      end
    end
    redis.call('DEL', KEYS[i] .. ':spent')
  end
  reply[#reply + 1] = #spent / 3
  for _, v in ipairs(spent) do reply[#reply + 1] = v end
end
return reply
