-- Floodgate: compare-and-set of the edge configuration, with its audit record.
--
-- KEYS[1] the configuration (a string holding JSON)
-- KEYS[2] the audit log (a list, newest first)
-- KEYS[3] the revision counter, KEYS[4] the change log (shared/src/changes.rs):
--         a save bumps the revision and logs "<rev> config", so edge instances
--         read the configuration again
-- ARGV[1] the version the change was based on: the SHA-1 of the stored text, or ""
--         when nothing was stored
-- ARGV[2] the new configuration text (validated by the caller)
-- ARGV[3] the audit record (JSON)
-- ARGV[4] how many audit records to keep
-- ARGV[5] with KEYS[3] and KEYS[4]: how many change log entries to keep
--
-- Returns {1, new version} when saved, {0, current version} when the stored
-- configuration is not the one the change was based on (nothing is written).
-- #include revision
local current = redis.call('GET', KEYS[1])
local version = ''
if current then
  version = redis.sha1hex(current)
end
if version ~= ARGV[1] then
  return {0, version}
end
local keep = tonumber(ARGV[4])
if not keep or keep < 1 then
  return redis.error_reply('ERR floodgate: ARGV[4] must be a positive count')
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, keep - 1)
if #KEYS == 4 then
  bump_revision(KEYS[3], KEYS[4], 'config', tonumber(ARGV[5]) or 1000)
end
return {1, redis.sha1hex(ARGV[2])}
