-- Floodgate regional pool: add a chunk of tokens just leased from the global bucket
-- (lua/lease_take.lua) to a region's pool, record the credit the same take
-- charged, and release the refill lock.
--
-- KEYS[1]  the pool;  KEYS[2]  its refill lock;  KEYS[3]  its credit in use
-- ARGV[1]  the chunk's member (the global lease's member; "" when the global take
--          leased nothing: only the lock is released)
-- ARGV[2]  tokens (0 ..)
-- ARGV[3]  how long the chunk may be spent, in µs from this Redis' TIME: the
--          global lease's lifetime less the time since its take was sent, so the
--          chunk dies before the global lease does
-- ARGV[4]  credit charged to the global bucket by the take (0 ..)
-- ARGV[5]  "1" when the global bucket was out of debt after the take: every
--          charged credit is released; "0": charged credit stays used
-- ARGV[6]  optional: the instant to use instead of TIME (µs; tests, replays)
--
-- Returns {tokens now in the pool's live chunks}; a chunk whose lifetime is already
-- over is not added.

if #KEYS ~= 3 or (#ARGV ~= 5 and #ARGV ~= 6) then
  return redis.error_reply('ERR floodgate: pool add expects 3 keys and 5 or 6 arguments')
end
local tokens, life, confirmed = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not (tokens and life and confirmed and tokens >= 0 and tokens % 1 == 0 and life % 1 == 0
    and confirmed >= 0 and confirmed % 1 == 0) or string.find(ARGV[1], '%s') then
  return redis.error_reply('ERR floodgate: bad pool chunk')
end
local clear = ARGV[5] == '1'
local now = tonumber(ARGV[6])
if ARGV[6] == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif not (now and now >= 0 and now % 1 == 0) then
  return redis.error_reply('ERR floodgate: bad instant')
end
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end
if ARGV[1] ~= '' and tokens > 0 and life > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:%d', tokens, now + life))
  local ttl = redis.call('PTTL', KEYS[1])
  local want = math.ceil(life / 1000) + 1000
  if ttl < want then redis.call('PEXPIRE', KEYS[1], want) end
end
redis.call('DEL', KEYS[2])
local used, uncharged = 0, 0
local c = redis.pcall('GET', KEYS[3])
if type(c) == 'table' and c.err then redis.call('DEL', KEYS[3]) end -- another type
if type(c) == 'string' then
  local u, x = string.match(c, '^(%d+):(%d+)$')
  -- a corrupt counter (pool_take reported none of it as unconfirmed) is rewritten
  if u and #u <= 15 and #x <= 15 and tonumber(x) <= tonumber(u) then
    used, uncharged = tonumber(u), tonumber(x)
  end
end
uncharged = math.max(0, uncharged - confirmed)
if clear then used = uncharged end
if used < uncharged then used = uncharged end
if used > 0 then
  redis.call('SET', KEYS[3], string.format('%d:%d', used, uncharged))
else
  redis.call('DEL', KEYS[3])
end
local total = 0
local raw = redis.call('HGETALL', KEYS[1])
for j = 1, #raw, 2 do
  local tk, expiry = string.match(raw[j + 1], '^(%d+):(%d+)$')
  if tk and tonumber(expiry) > now then total = total + tonumber(tk) end
end
return {total}
