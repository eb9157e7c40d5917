-- Floodgate lease: give back the tokens of a lease its holder did not spend.
--
-- The holder stops spending before it calls this (or at the lease's expiry, when
-- the lease simply lapses and its tokens are lost: never an overshoot). The refund
-- moves full_at back by the unused tokens, but never below now, and never by more
-- than the bucket could still owe them: had the lease not been taken, the bucket
-- would have been full (wasting refill) from `base` on, so every token of time
-- elapsed past `base` is one fewer to give back.
--
-- KEYS[1]  the bucket;  KEYS[2]  its lease book (lua/lease_take.lua)
-- ARGV[1]  now in microseconds, or "" for Redis TIME
-- ARGV[2]  T (microseconds per token)
-- ARGV[3]  the lease's member as take recorded it: "<id>:<tokens>:<base>"
-- ARGV[4]  unused tokens
--
-- Returns {refunded, now, full_at}.
--
-- Commands run: TIME, one MGET, at most two writes.

-- #include clock
if #KEYS ~= 2 or #ARGV ~= 4 then
  return redis.error_reply('ERR floodgate: lease return expects 2 keys and 4 arguments')
end
local now = clock(ARGV[1])
if now == nil or string.sub(ARGV[1], 1, 1) == '<' then
  return redis.error_reply('ERR floodgate: bad now')
end
local t, unused = tonumber(ARGV[2]), tonumber(ARGV[4])
if not (t and unused and t >= 1 and unused >= 0) then
  return redis.error_reply('ERR floodgate: bad lease return arguments')
end
local _, _, granted, base = string.find(ARGV[3], '^[^:@]*:(%d+):(%d+)$')
local raws = redis.call('MGET', KEYS[1], KEYS[2])
-- the lease leaves the book whatever happens to its tokens
local expires, rest, found = nil, {}, false
if type(raws[2]) == 'string' then
  for entry in string.gmatch(raws[2], '%S+') do
    local member, at = string.match(entry, '^(.*)@(%d+)$')
    if member == ARGV[3] and not found then
      expires, found = tonumber(at), true
    else
      rest[#rest + 1] = entry
    end
  end
end
if found then
  if #rest == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('SET', KEYS[2], table.concat(rest, ' '), 'KEEPTTL')
  end
end
local full_at = 0
local raw = raws[1]
if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
  full_at = tonumber(raw)
end
if not granted or not expires or expires <= now then
  return {0, now, full_at}
end
local refund = math.min(unused, tonumber(granted))
local wasted = tonumber(base) < now and math.ceil((now - tonumber(base)) / t) or 0
refund = refund - wasted
if refund <= 0 or full_at <= now then
  return {0, now, full_at}
end
local new_full = full_at - refund * t
if new_full <= now then
  redis.call('DEL', KEYS[1])
  return {refund, now, now}
end
local expiry = math.ceil(new_full / 1000000) * 1000000
redis.call('SET', KEYS[1], string.format('%d', new_full),
  'PX', string.format('%d', math.ceil((expiry - now) / 1000)))
return {refund, now, new_full}
