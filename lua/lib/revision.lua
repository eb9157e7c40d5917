-- The records' revision (shared/src/changes.rs), one function for every script
-- that changes a record the edge caches: bumps the counter and logs
-- "<rev> <change>" (newest first, `keep` entries). Returns the new revision.
local function bump_revision(rev_key, log_key, change, keep)
  local rev = redis.pcall('INCR', rev_key)
  if type(rev) == 'table' then
    -- not a number: start again at Redis' instant in µs, a value no instance has
    -- seen, so every instance reads everything again
    local t = redis.call('TIME')
    rev = t[1] * 1000000 + t[2]
    redis.call('SET', rev_key, string.format('%d', rev))
    redis.call('DEL', log_key)
  end
  redis.call('LPUSH', log_key, rev .. ' ' .. change)
  redis.call('LTRIM', log_key, 0, keep - 1)
  return rev
end
