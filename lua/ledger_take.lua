-- Floodgate regional ledger: take a region's ledger to charge it (shared/src/ledger.rs).
--
-- KEYS[1] the ledger (a hash: field "<bucket>\t<µs per token>\t<burst µs>" -> count)
-- KEYS[2] the ledger being settled
--
-- A ledger left being settled by a settler that did not finish is taken again
-- (charged first); else the ledger is renamed to it (edges count in a new one from
-- this instant on). Returns the settled ledger as {field, count, field, count, ...}.
--
-- Commands run: RENAMENX (when no settlement is pending), HGETALL.
if #KEYS ~= 2 then
  return redis.error_reply('ERR floodgate: ledger take expects 2 keys')
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local renamed = redis.pcall('RENAMENX', KEYS[1], KEYS[2])
  if type(renamed) == 'table' then
    -- no ledger: nothing admitted since the last settlement
    return {}
  end
end
return redis.call('HGETALL', KEYS[2])
