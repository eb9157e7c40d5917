-- Floodgate regional pool: add a chunk of tokens just leased from the global bucket
-- (lua/lease_take.lua) to a region's pool, release the refill lock, and hand back
-- the members of chunks spent since the last refill (the next global take retires
-- them, so the global bound counts only tokens still unspent).
--
-- KEYS[1]  the pool;  KEYS[2]  its refill lock;  KEYS[3]  its spent list
-- ARGV[1]  the chunk's member (the global lease's member; "" when the global take
--          leased nothing: only the lock is released and the spent list returned)
-- ARGV[2]  tokens (0 ..)
-- ARGV[3]  how long the chunk may be spent, in µs from this Redis' TIME: the
--          global lease's lifetime less the time since its take was sent, so the
--          chunk dies before the global lease does
--
-- Returns the spent members as integers, three each ({id, tokens, base} of
-- "<id>:<tokens>:<base>": lease ids of pools are numbers), and clears the list; a
-- chunk whose lifetime is already over is not added.

if #KEYS ~= 3 or #ARGV ~= 3 then
  return redis.error_reply('ERR floodgate: pool add expects 3 keys and 3 arguments')
end
local tokens, life = tonumber(ARGV[2]), tonumber(ARGV[3])
if not (tokens and life and tokens >= 0 and tokens % 1 == 0 and life % 1 == 0)
    or string.find(ARGV[1], '%s') then
  return redis.error_reply('ERR floodgate: bad pool chunk')
end
local spent = {}
local raw = redis.pcall('LRANGE', KEYS[3], 0, -1)
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
redis.call('DEL', KEYS[3])
if ARGV[1] ~= '' and tokens > 0 and life > 0 then
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local until_us = now + life
  if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:%d', tokens, until_us))
  local ttl = redis.call('PTTL', KEYS[1])
  local want = math.ceil(life / 1000) + 1000
  if ttl < want then redis.call('PEXPIRE', KEYS[1], want) end
end
redis.call('DEL', KEYS[2])
return spent
