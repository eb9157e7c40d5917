-- Floodgate: record that a record the edge caches changed (an API key's), so edge
-- instances read it again (shared/src/changes.rs). The configuration's own save
-- does the same inside lua/config_cas.lua.
--
-- KEYS[1] the revision counter;  KEYS[2] the change log (newest first)
-- ARGV[1] what changed ("key:<sha256>");  ARGV[2] how many entries the log keeps
--
-- Returns the new revision.
local keep = tonumber(ARGV[2])
if #KEYS ~= 2 or not keep or keep < 1 or not string.find(ARGV[1], '^key:%x+$') then
  return redis.error_reply('ERR floodgate: changed expects 2 keys, a change and a count')
end
local rev = redis.pcall('INCR', KEYS[1])
if type(rev) == 'table' then
  -- not a number: start again at Redis' instant in µs, a value no instance has
  -- seen, so every instance reads everything again
  local t = redis.call('TIME')
  rev = t[1] * 1000000 + t[2]
  redis.call('SET', KEYS[1], string.format('%d', rev))
  redis.call('DEL', KEYS[2])
end
redis.call('LPUSH', KEYS[2], rev .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[2], 0, keep - 1)
return rev
