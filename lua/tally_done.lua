-- Floodgate regional tally: a settlement done (shared/src/tally.rs, `done_args`).
--
-- KEYS[1] the slot being settled (dropped)
-- KEYS[2] the carry
-- KEYS[3], KEYS[4] the other two slots of the ring (the current epoch's and the
--         next one's): where a bucket in debt is blocked
-- ARGV[1] the block (added to a blocked bucket's count: far above any credit)
-- ARGV[2] "1": the carry was charged whole (a sweep) and is dropped, else "0"
-- ARGV[3] n, then n pairs (field, count): counts carried (written to the carry)
-- then m, then m fields: carried before and charged now (dropped from the carry)
-- then b, then b fields: buckets in debt, blocked in KEYS[3] and KEYS[4]
--
-- Returns the number of buckets blocked. Malformed arguments change nothing.
--
-- Commands run: DEL, one HSET of the carried counts (or DEL of the carry), one
-- HDEL, two HINCRBY per blocked bucket (a bucket in debt is rare).
if #KEYS ~= 4 then
  return redis.error_reply('ERR floodgate: tally done expects 4 keys')
end
local bad = 'ERR floodgate: bad tally done arguments'
local block = tonumber(ARGV[1])
if not (block and block >= 1 and block % 1 == 0 and (ARGV[2] == '0' or ARGV[2] == '1')) then
  return redis.error_reply(bad)
end
local i = 3
local function list(per)
  local n = tonumber(ARGV[i])
  if not (n and n >= 0 and n % 1 == 0 and i + n * per <= #ARGV) then
    return nil
  end
  local items = {}
  for k = i + 1, i + n * per do
    items[#items + 1] = ARGV[k]
  end
  i = i + n * per + 1
  return items
end
local carried, uncarried, blocked = list(2), nil, nil
if carried then uncarried = list(1) end
if uncarried then blocked = list(1) end
if not blocked or i ~= #ARGV + 1 then
  return redis.error_reply(bad)
end
for k = 2, #carried, 2 do
  local n = carried[k]
  if not (string.find(n, '^%d+$') and #n <= 15) then
    return redis.error_reply(bad)
  end
end
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[2])
end
if #carried > 0 then
  redis.call('HSET', KEYS[2], unpack(carried))
end
if #uncarried > 0 and ARGV[2] == '0' then
  redis.call('HDEL', KEYS[2], unpack(uncarried))
end
for _, f in ipairs(blocked) do
  redis.call('HINCRBY', KEYS[3], f, block)
  redis.call('HINCRBY', KEYS[4], f, block)
end
return #blocked
