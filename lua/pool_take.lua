-- Floodgate regional pool: decide a request's bounded buckets from the tokens a
-- region holds, in ONE regional round trip, atomically.
--
-- A pool lives in a regional Redis next to the edges of one region. It holds, per
-- bucket, chunks of tokens leased from the global bucket (lua/lease_take.lua): a
-- hash, field = the global lease's member, value = "<tokens>:<expires_at>" (µs,
-- this Redis' clock; a chunk expires before its global lease does). The global
-- Redis bounds the tokens outstanding on all leases, so however the pools of all
-- regions spend, admissions stay within the policy's max_overshoot.
--
-- KEYS[i]        the pool of bucket i
-- KEYS[n+i]      the refill lock of bucket i (a plain key with a TTL)
-- ARGV[1]        the clock: "" for Redis TIME, "<T" for TIME but only while TIME <= T
--                (a later call changes nothing and returns {2, now}), or µs
-- ARGV[2i]       cost of bucket i in tokens (1 ..)
-- ARGV[2i+1]     low-water mark of bucket i: below it after this call, the caller
--                is asked to refill (0: never)
-- ARGV[2n+2]     the refill lock's lifetime in ms (1 ..)
--
-- Returns {admitted, now, then per bucket: tokens left, refill, k, k x 3 integers}:
-- admitted = 1 when every pool held the cost in live chunks (all were then spent,
-- from the chunks expiring first), 0 when one did not (nothing was spent
-- anywhere); refill = 1 when this caller took bucket i's refill lock and must
-- refill it (one refill at a time per region). Chunks spent to the last token are
-- removed and their members ("<id>:<tokens>:<base>", all numbers) kept in
-- "<pool>:spent"; the caller that takes the refill lock also takes that list (k
-- members as {id, tokens, base}) to retire at the global Redis with its take, so
-- the global bound counts only tokens still unspent. Corrupt chunks count as empty
-- and are dropped.

local MAX_INSTANT = 4503599627370496
local n = #KEYS / 2
if n < 1 or n % 1 ~= 0 or #ARGV ~= 2 * n + 2 then
  return redis.error_reply('ERR floodgate: pool take expects 2 x n keys and 2 + 2 x n arguments')
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
local lock_ms = tonumber(ARGV[2 * n + 2])
if not (lock_ms and lock_ms >= 1 and lock_ms % 1 == 0) then
  return redis.error_reply('ERR floodgate: bad refill lock lifetime')
end

-- Phase 1: read every pool's live chunks, soonest expiry first.
local pools, totals = {}, {}
local admitted = 1
for i = 1, n do
  local cost, low = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if not (cost and low and cost >= 1 and low >= 0 and cost % 1 == 0 and low % 1 == 0) then
    return redis.error_reply('ERR floodgate: bad cost or low-water mark for KEYS[' .. i .. ']')
  end
  local chunks, total = {}, 0
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
  end
  table.sort(chunks, function(a, b) return a[3] < b[3] end)
  pools[i], totals[i] = chunks, total
  if total < cost then admitted = 0 end
end

-- Phase 2: spend (all or nothing), then hand out refill locks.
local reply = {admitted, now}
for i = 1, n do
  local cost, low = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local left = totals[i]
  if admitted == 1 then
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
  local refill = 0
  if left < low and redis.call('SET', KEYS[n + i], '1', 'NX', 'PX', lock_ms) then
    refill = 1
  end
  reply[#reply + 1] = left
  reply[#reply + 1] = refill
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
