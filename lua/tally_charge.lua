-- Floodgate regional tally: charge what a region admitted to the global buckets,
-- in ONE call whatever the number of buckets (shared/src/tally.rs, `charged`).
--
-- KEYS[i]          bucket i (token bucket; under Redis Cluster, one slot per call)
-- ARGV[1]          the clock: "" for Redis TIME, or µs (tests)
-- ARGV[3i-1..3i+1] bucket i: µs per token, burst window µs, tokens to charge
--
-- Each bucket's full_at moves to max(full_at, now) + tokens x T: into debt if
-- need be (the region admitted them already); its key expires once full again.
-- Returns {now, full_at of each bucket after the charge}.
--
-- Commands run: TIME, one MGET, one SET per bucket charged.
-- #include clock
local n = #KEYS
if n < 1 or #ARGV ~= 3 * n + 1 then
  return redis.error_reply('ERR floodgate: tally charge expects 1 + 3 x #KEYS arguments')
end
local now = clock(ARGV[1])
if now == nil or string.sub(ARGV[1], 1, 1) == '<' then
  return redis.error_reply('ERR floodgate: ARGV[1] must be empty or microseconds')
end
local raws = redis.call('MGET', unpack(KEYS))
local reply = {now}
for i = 1, n do
  local t, burst, tokens = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  if not (t and burst and tokens and t >= 1 and burst >= 1 and tokens >= 0
      and t % 1 == 0 and burst % 1 == 0 and tokens % 1 == 0 and tokens * t <= MAX_INSTANT) then
    return redis.error_reply('ERR floodgate: bad charge for KEYS[' .. i .. ']')
  end
  local full_at = 0
  local raw = raws[i]
  if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
    full_at = tonumber(raw)
  end
  if tokens > 0 then
    full_at = math.max(full_at, now) + tokens * t
    redis.call('SET', KEYS[i], string.format('%d', full_at),
      'PX', string.format('%d', math.ceil((full_at - now) / 1000) + 1000))
  end
  reply[i + 1] = full_at
end
return reply
