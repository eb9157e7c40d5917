-- Floodgate: record that a record the edge caches changed (an API key's), so edge
-- instances read it again (shared/src/changes.rs). The configuration's own save
-- does the same inside lua/config_cas.lua, and a key's save inside lua/key_cas.lua
-- where the store takes both in one call.
--
-- KEYS[1] the revision counter;  KEYS[2] the change log (newest first)
-- ARGV[1] what changed ("key:<sha256>");  ARGV[2] how many entries the log keeps
--
-- Returns the new revision.
-- #include revision
local keep = tonumber(ARGV[2])
if #KEYS ~= 2 or not keep or keep < 1 or not string.find(ARGV[1], '^key:%x+$') then
  return redis.error_reply('ERR floodgate: changed expects 2 keys, a change and a count')
end
return bump_revision(KEYS[1], KEYS[2], ARGV[1], keep)
