-- Floodgate: compare-and-set of one API key's record (the admin API's and the
-- dashboard's updates, edge/src/admin.rs), so concurrent changes never lose one;
-- on a store that takes them in one call, the revision is bumped in the same
-- atomic step, so no saved change goes unannounced to the edges.
--
-- KEYS[1] the key's record (fg:apikey:<sha256>, a string holding JSON)
-- KEYS[2], KEYS[3] (optional, together) the revision counter and the change log
--         (shared/src/changes.rs); on Redis Cluster they are in another slot,
--         and the caller runs lua/changed.lua after the save instead
-- ARGV[1] the version the change was based on: the SHA-1 of the stored text
-- ARGV[2] the new record (validated by the caller)
-- ARGV[3], ARGV[4] with KEYS[2] and KEYS[3]: what changed ("key:<sha256>") and
--         how many entries the change log keeps
--
-- Returns {1, new version} when saved, {0, current version} when the stored
-- record is not the one the change was based on ('' when none is stored: a key
-- is never created here), nothing written.
-- #include revision
if not (#KEYS == 1 or (#KEYS == 3 and tonumber(ARGV[4]) and tonumber(ARGV[4]) >= 1)) then
  return redis.error_reply('ERR floodgate: key_cas expects 1 key, or 3 with a change and a count')
end
local current = redis.call('GET', KEYS[1])
if not current then
  return {0, ''}
end
local version = redis.sha1hex(current)
if version ~= ARGV[1] then
  return {0, version}
end
redis.call('SET', KEYS[1], ARGV[2])
if #KEYS == 3 then
  bump_revision(KEYS[2], KEYS[3], ARGV[3], tonumber(ARGV[4]))
end
return {1, redis.sha1hex(ARGV[2])}
