-- Floodgate regional tally: take a finished epoch's slot to settle it
-- (shared/src/tally.rs).
--
-- KEYS[1] the finished slot (a hash: field "<bucket>\t<µs per token>\t<burst µs>"
--         -> count)
-- KEYS[2] the slot being settled
-- KEYS[3] the carry (field -> count carried from earlier settlements)
--
-- A slot left being settled by a settler that did not finish is taken again
-- (charged first; the finished slot waits for the next settlement); else the
-- finished slot is renamed to it (requests of a later epoch that reuses the slot
-- count in a new one). Returns {flag, field, count, carried, ...}: flag "0"
-- nothing to settle, "1" the pending settlement, "2" the slot just renamed.
--
-- Commands run: EXISTS, RENAME (when no settlement is pending), HGETALL, one
-- HMGET of the carry per 1,000 fields.
if #KEYS ~= 3 then
  return redis.error_reply('ERR floodgate: tally take expects 3 keys')
end
local flag = '1'
if redis.call('EXISTS', KEYS[2]) == 0 then
  local renamed = redis.pcall('RENAME', KEYS[1], KEYS[2])
  if type(renamed) == 'table' and renamed.err then
    -- no slot: nothing was counted in that epoch
    return {'0'}
  end
  flag = '2'
end
local all = redis.call('HGETALL', KEYS[2])
local reply = {flag}
local fields = {}
for i = 1, #all, 2 do
  fields[#fields + 1] = all[i]
end
local carried = {}
for first = 1, #fields, 1000 do
  local last = math.min(first + 999, #fields)
  local got = redis.call('HMGET', KEYS[3], unpack(fields, first, last))
  for i = 1, #got do
    carried[first + i - 1] = got[i]
  end
end
for i = 1, #fields do
  local c = carried[i]
  if type(c) ~= 'string' then
    c = '0'
  end
  reply[#reply + 1] = fields[i]
  reply[#reply + 1] = all[2 * i]
  reply[#reply + 1] = c
end
return reply
