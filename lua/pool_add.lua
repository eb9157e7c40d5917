-- Floodgate regional pool: add a chunk of tokens just leased from the global bucket
-- (lua/lease_take.lua) to a region's pool (lua/pool_take.lua has its format),
-- record the credit the same take charged, and release the refill lock.
--
-- KEYS[1]  the pool
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
-- over is not added. A pool that does not parse is rewritten with only this chunk
-- and all credit released but what this take left uncharged (none: corrupt state
-- is never read as unconfirmed credit, so it was never charged): nothing is minted.
--
-- Commands run: TIME, one GET, one SET.

if #KEYS ~= 1 or (#ARGV ~= 5 and #ARGV ~= 6) then
  return redis.error_reply('ERR floodgate: pool add expects 1 key and 5 or 6 arguments')
end
local tokens, life, confirmed = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not (tokens and life and confirmed and tokens >= 0 and tokens % 1 == 0 and life % 1 == 0
    and confirmed >= 0 and confirmed % 1 == 0) or string.find(ARGV[1], '[%s=|,]') then
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

local used, uncharged, chunks, spent = 0, 0, {}, ''
local raw = redis.pcall('GET', KEYS[1]) -- another type: an empty pool, rewritten
if type(raw) == 'string' then
  local credit, _, list, s = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  local u, x = string.match(credit or '', '^(%d+):(%d+)$')
  if u and #u <= 15 and #x <= 15 and tonumber(x) <= tonumber(u) then
    used, uncharged, spent = tonumber(u), tonumber(x), s
    for c in string.gmatch(list, '%S+') do
      local at = string.match(c, '^[^=]+=%d+,%d+,(%d+)$')
      if at and #at <= 16 and tonumber(at) > now then chunks[#chunks + 1] = c end
    end
  end
end
if ARGV[1] ~= '' and tokens > 0 and life > 0 then
  chunks[#chunks + 1] = ARGV[1] .. '=' .. tokens .. ',0,' .. string.format('%d', now + life)
end
uncharged = math.max(0, uncharged - confirmed)
if clear then used = uncharged end
if used < uncharged then used = uncharged end
local total, last = 0, now
for _, c in ipairs(chunks) do
  local free, at = string.match(c, '=(%d+),%d+,(%d+)$')
  total = total + tonumber(free)
  if tonumber(at) > last then last = tonumber(at) end
end
local text = used .. ':' .. uncharged .. '|0|' .. table.concat(chunks, ' ') .. '|' .. spent
if used > 0 then
  redis.call('SET', KEYS[1], text)
else
  redis.call('SET', KEYS[1], text, 'PX', math.ceil((last - now) / 1000) + 1000)
end
return {total}
