-- The clock of a script's call, one reading for every script: `arg` "" reads Redis
-- TIME (one clock for all edges); "<T" reads TIME but the call is stale once TIME
-- is past T (µs; the caller stopped waiting: it must change nothing); otherwise
-- an instant in µs to decide at (tests, replays). Returns now and whether the call
-- is stale, or nil for an argument that is none of these.
local MAX_INSTANT = 4503599627370496
local function clock(arg)
  local expires = nil
  if string.sub(arg, 1, 1) == '<' then
    expires = tonumber(string.sub(arg, 2))
    if expires == nil or expires < 0 or expires > MAX_INSTANT or expires % 1 ~= 0 then
      return nil
    end
    arg = ''
  end
  if arg == '' then
    local t = redis.call('TIME')
    local now = t[1] * 1000000 + t[2]
    return now, expires ~= nil and now > expires
  end
  local now = tonumber(arg)
  if now == nil or now < 0 or now > MAX_INSTANT or now % 1 ~= 0 then
    return nil
  end
  return now, false
end
local BAD_CLOCK = 'ERR floodgate: ARGV[1] must be empty, <microseconds or microseconds in 0..2^52'
