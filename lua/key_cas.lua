-- Floodgate: compare-and-set of one API key's record (the admin API's and the
-- dashboard's updates, edge/src/admin.rs), so concurrent changes never lose one.
--
-- KEYS[1] the key's record (fg:apikey:<sha256>, a string holding JSON)
-- ARGV[1] the version the change was based on: the SHA-1 of the stored text
-- ARGV[2] the new record (validated by the caller)
--
-- Returns {1, new version} when saved, {0, current version} when the stored
-- record is not the one the change was based on ('' when none is stored: a key
-- is never created here), nothing written.
local current = redis.call('GET', KEYS[1])
if not current then
  return {0, ''}
end
local version = redis.sha1hex(current)
if version ~= ARGV[1] then
  return {0, version}
end
redis.call('SET', KEYS[1], ARGV[2])
return {1, redis.sha1hex(ARGV[2])}
