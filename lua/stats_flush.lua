-- Floodgate: one edge instance's statistics flush in ONE call (edge/src/stats.rs,
-- shared/src/stats.rs): its counts of each minute written whole into its own
-- field of the minute's hash (so a flush that failed is made good by the next,
-- and a retried one counts nothing twice), the decisions it sampled pushed onto
-- the sample list, its keys' last use. Everything is checked before anything is
-- written: malformed input is refused with `ERR floodgate: ...` and nothing is
-- written.
--
-- KEYS: the M minute hashes (fg:stats:<minute>), then the sample list when S > 0,
--       then the last-use hash when L > 0
-- ARGV[1] this instance's field      ARGV[2] a minute hash's TTL (seconds)
-- ARGV[3] how many entries the sample keeps: once it holds a quarter more it is
--         trimmed back (so LTRIM runs once per keep/4 entries, not per flush)
-- ARGV[4] M   ARGV[5] S   ARGV[6] L
-- then M x (the minute's counts, a JSON object; 1 to give the hash its TTL, or 0),
-- S sample entries (`<unix ms>|<key id>|...`), L x (key id, Unix seconds)
--
-- Returns the sample's length after the push (0 when there was no sample).
local function refuse(why)
  return redis.error_reply('ERR floodgate: stats flush: ' .. why)
end
local function count(s)
  if type(s) ~= 'string' or not string.find(s, '^%d+$') then
    return nil
  end
  return tonumber(s)
end

local field, ttl, keep = ARGV[1], count(ARGV[2]), count(ARGV[3])
local m, s, l = count(ARGV[4]), count(ARGV[5]), count(ARGV[6])
if not (field and ttl and keep and m and s and l) or ttl < 1 or keep < 1 then
  return refuse('expects a field, a TTL, a sample size and three counts')
end
if not string.find(field, '^@[%w]+$') then
  return refuse('the instance field must be @<instance>')
end
local with_sample = s > 0 and 1 or 0
local with_last_used = l > 0 and 1 or 0
if #KEYS ~= m + with_sample + with_last_used or #ARGV ~= 6 + 2 * m + s + 2 * l then
  return refuse('the keys and arguments do not match the counts')
end

-- check everything first
for i = 1, m do
  local counts, expire = ARGV[6 + 2 * i - 1], ARGV[6 + 2 * i]
  local ok, decoded = pcall(cjson.decode, counts)
  if not ok or type(decoded) ~= 'table' or string.sub(counts, 1, 1) ~= '{' then
    return refuse('the counts of ' .. KEYS[i] .. ' are not a JSON object')
  end
  if expire ~= '0' and expire ~= '1' then
    return refuse('the TTL flag of ' .. KEYS[i] .. ' must be 0 or 1')
  end
end
local first_entry = 6 + 2 * m + 1
for i = first_entry, first_entry + s - 1 do
  if not string.find(ARGV[i], '^%d+|[^|]+|') then
    return refuse('sample entry ' .. (i - first_entry + 1) .. ' is malformed')
  end
end
local first_pair = first_entry + s
for i = first_pair, first_pair + 2 * l - 1, 2 do
  if ARGV[i] == '' or not count(ARGV[i + 1]) then
    return refuse('last use ' .. ((i - first_pair) / 2 + 1) .. ' needs a key id and Unix seconds')
  end
end

-- then write; long argument lists in parts (Lua's unpack has a limit)
local PART = 1000
local function in_parts(cmd, key, from, to, step)
  local reply = 0
  for i = from, to, PART * step do
    reply = redis.call(cmd, key, unpack(ARGV, i, math.min(to, i + PART * step - 1)))
  end
  return reply
end
for i = 1, m do
  redis.call('HSET', KEYS[i], field, ARGV[6 + 2 * i - 1])
  if ARGV[6 + 2 * i] == '1' then
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
local length = 0
if s > 0 then
  local list = KEYS[m + 1]
  length = in_parts('LPUSH', list, first_entry, first_entry + s - 1, 1)
  if length > keep + math.floor(keep / 4) then
    redis.call('LTRIM', list, 0, keep - 1)
    length = keep
  end
end
if l > 0 then
  in_parts('HSET', KEYS[m + with_sample + 1], first_pair, first_pair + 2 * l - 1, 2)
end
return length
