-- Floodgate concurrency limiter: take one in-flight slot for a request.
--
-- KEYS[1]  a sorted set of slots (member = slot id, score = expiry in ms, Redis TIME)
-- ARGV[1]  the slot id (unique per request)
-- ARGV[2]  the most slots held at once (1 .. 100000)
-- ARGV[3]  how long a slot lives unless released, in ms (a crashed instance's
--          slots expire then)
-- ARGV[4]  optional: the last instant (Redis TIME, µs) at which the caller still
--          waits for the answer; a call run later changes nothing and returns {2, 0}
--
-- Returns {taken, held}: taken = 1 when the slot was added, 0 when the limit is
-- reached (nothing written), 2 when the call came too late (stale, nothing
-- written); held = slots held after the call. Releasing a slot is
-- a plain ZREM of its id. All in one script, so the check and the add are atomic.

local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
if not (limit and ttl and limit >= 1 and ttl >= 1 and limit % 1 == 0 and ttl % 1 == 0) then
  return redis.error_reply('ERR floodgate: bad in-flight limit or slot ttl')
end
local expires = ARGV[4]
if expires ~= nil then
  expires = tonumber(expires)
  if not (expires and expires >= 0 and expires % 1 == 0) then
    return redis.error_reply('ERR floodgate: bad in-flight expiry')
  end
end
local t = redis.call('TIME')
if expires ~= nil and t[1] * 1000000 + t[2] > expires then
  return {2, 0}
end
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= limit then
  return {0, held}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
-- the set itself goes once its last slot would have expired
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]))
return {1, held + 1}
