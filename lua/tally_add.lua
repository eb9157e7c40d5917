-- Floodgate regional tally: a chunk leased from the global bucket taken off a
-- slot's count, so the region admits that many more (shared/src/tally.rs).
--
-- KEYS[1] the slot of the chunk's epoch
-- ARGV[1] the clock: "<T" (µs, this store's clock): nothing is added once TIME
--         is past T, the chunk's expiry (a call that arrives late, after the
--         slot may have been settled and reused, must not mint tokens); or an
--         instant in µs (tests)
-- ARGV[2] the field;  ARGV[3] the chunk's tokens (1..10^9)
--
-- Returns the count after it, or nil when it came too late.
--
-- Commands run: TIME, HINCRBY.
-- #include clock
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply('ERR floodgate: tally add expects 1 key and 3 arguments')
end
local now, stale = clock(ARGV[1])
local tokens = tonumber(ARGV[3])
if now == nil or not (tokens and tokens >= 1 and tokens <= 1000000000 and tokens % 1 == 0)
    or ARGV[2] == '' then
  return redis.error_reply('ERR floodgate: bad tally add arguments')
end
if stale then
  return false
end
return redis.call('HINCRBY', KEYS[1], ARGV[2], -tokens)
