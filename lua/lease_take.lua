-- Floodgate lease: decide one request exactly AND take up to N more tokens from the
-- same bucket for the caller to spend locally (the design's "distributed token
-- bucket"), atomically. The bucket is the token bucket's one integer full_at
-- (lua/token_bucket.lua); taking n tokens advances it by n x T when they fit.
--
-- Tokens out on leases are the overshoot: a lease spent later than it was taken can
-- push the admissions of a window past capacity + refill x window by at most the
-- tokens outstanding. KEYS[2], the book, records every live lease in one string —
-- "<member>@<expires_at> ..." with member = "<id>:<tokens>:<base>" — and no lease
-- is granted past ARGV[6] tokens outstanding in total, so the overshoot bound is
-- enforced here, whatever the number of edge instances and regions.
--
-- KEYS[1]  the bucket;  KEYS[2]  its lease book (same hash tag: same cluster slot)
-- ARGV[1]  now in microseconds, or "" for Redis TIME
-- ARGV[2]  burst window (capacity x T);  ARGV[3]  T (microseconds per token)
-- ARGV[4]  cost of this request in tokens (0: only lease)
-- ARGV[5]  tokens wanted for the lease;  ARGV[6]  bound on tokens outstanding
-- ARGV[7]  lease lifetime in microseconds;  ARGV[8]  lease id
-- ARGV[9]  the members of the caller's previous leases now spent to the last
--          token (or spent out by its sub-leases), separated by spaces ("" for
--          none): no longer outstanding
-- ARGV[10] optional, "1": charge the cost even without room (the bucket goes into
--          debt, repaid by later denials; admitted is then 0): a region confirming
--          requests it admitted on its credit (lua/pool_take.lua); a lease is then
--          taken only from what room is left
--
-- Returns {admitted, leased, now, full_at, expires_at, outstanding}: admitted 1/0
-- for the request (a denial writes nothing and leases nothing), the tokens leased
-- (0 when none fit), Redis' instant, the bucket's full_at after the call, the
-- lease's expiry (Redis clock) and the tokens outstanding on live leases after the
-- call (0 on a denial).
--
-- A book that does not parse counts as the whole bound outstanding (no lease is
-- granted) until it expires (its TTL is the lifetime and a second): nothing is
-- ever minted from corrupt state.
--
-- Commands run: TIME, one MGET, at most two SETs (what a bill counts besides the
-- EVALSHA itself).

local MAX_WINDOW = 34560000000000
-- #include clock
if #KEYS ~= 2 or (#ARGV ~= 9 and #ARGV ~= 10) then
  return redis.error_reply('ERR floodgate: lease take expects 2 keys and 9 or 10 arguments')
end
local forced = ARGV[10] == '1'
local now = clock(ARGV[1])
if now == nil or string.sub(ARGV[1], 1, 1) == '<' then
  return redis.error_reply('ERR floodgate: bad now')
end
local burst, t = tonumber(ARGV[2]), tonumber(ARGV[3])
local cost, want, bound, life = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if not (burst and t and cost and want and bound and life and burst >= 1 and burst <= MAX_WINDOW
    and t >= 1 and t <= burst and cost >= 0 and want >= 0 and bound >= 0 and life >= 1
    and life <= MAX_WINDOW) then
  return redis.error_reply('ERR floodgate: bad lease arguments')
end

local raws = redis.call('MGET', KEYS[1], KEYS[2])
local full_at = 0
local raw = raws[1]
if type(raw) == 'string' and #raw <= 16 and string.find(raw, '^%d+$') then
  full_at = tonumber(raw)
  if full_at > now + MAX_WINDOW then full_at = 0 end
end
local base = full_at
if base < now then base = now end
local room = math.floor((burst - (base - now)) / t)
local fits = room >= cost
if not fits and not forced then
  return {0, 0, now, full_at, 0, 0}
end

-- Live leases only: an expired lease's holder has stopped spending it, and a
-- retired one has nothing left to spend. One expiring implausibly late (past 100
-- lifetimes) is dropped.
local retired = {}
for member in string.gmatch(ARGV[9], '%S+') do retired[member] = true end
local book, outstanding, corrupt, changed = {}, 0, false, false
if type(raws[2]) == 'string' then
  for entry in string.gmatch(raws[2], '%S+') do
    local member, n, expires = string.match(entry, '^([^:@]*:(%d+):%d+)@(%d+)$')
    if member == nil or #n > 15 or #expires > 16 then
      corrupt = true
    else
      expires = tonumber(expires)
      if expires <= now or expires > now + 100 * life or retired[member] then
        changed = true
      else
        book[#book + 1] = entry
        outstanding = outstanding + tonumber(n)
      end
    end
  end
end
if corrupt then
  outstanding = bound
  changed = false
end
local extra = math.min(want, room - cost, bound - outstanding)
if extra < 0 then extra = 0 end

local taken = cost + extra
local expires_at = 0
if taken > 0 then
  local new_full = base + taken * t
  local expiry = math.ceil(new_full / 1000000) * 1000000
  redis.call('SET', KEYS[1], string.format('%d', new_full),
    'PX', string.format('%d', math.ceil((expiry - now) / 1000)))
  full_at = new_full
end
if extra > 0 then
  expires_at = now + life
  -- base: where the bucket would be without this lease's tokens (see lease_return.lua)
  book[#book + 1] = ARGV[8] .. ':' .. extra .. ':' .. string.format('%d', full_at - extra * t)
    .. '@' .. string.format('%d', expires_at)
  changed = true
end
if changed then
  if #book == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('SET', KEYS[2], table.concat(book, ' '),
      'PX', string.format('%d', math.ceil(life / 1000) + 1000))
  end
end
return {fits and 1 or 0, extra, now, full_at, expires_at, outstanding + extra}
