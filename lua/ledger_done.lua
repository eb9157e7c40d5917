-- Floodgate regional ledger: a settlement is done (shared/src/ledger.rs).
--
-- KEYS[1] the ledger;  KEYS[2] the ledger that was settled
-- ARGV[1] the blocked count (ledger::BLOCKED)
-- ARGV[2..] the fields whose bucket the charge left in debt: blocked in the ledger
--           (the count raised by ARGV[1]: every edge's increment overflows its share
--           and goes to the pool) until a later settlement finds the debt repaid
--
-- Returns the number of fields blocked.
--
-- Commands run: DEL, one HINCRBY per blocked field.
local blocked = tonumber(ARGV[1])
if #KEYS ~= 2 or not blocked or blocked < 1 then
  return redis.error_reply('ERR floodgate: ledger done expects 2 keys and the blocked count')
end
redis.call('DEL', KEYS[2])
for i = 2, #ARGV do
  redis.call('HINCRBY', KEYS[1], ARGV[i], blocked)
end
return #ARGV - 1
