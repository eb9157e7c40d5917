-- Floodgate regional pool: decide a request's bounded buckets from what a region
-- holds, and hand the caller a sub-lease of tokens to spend in its own memory, in
-- ONE regional round trip, atomically.
--
-- A pool lives in a regional Redis next to the edges of one region, ONE string
-- per bucket:
--
--   "<used>:<uncharged>|<lock until>|<chunk> <chunk> ...|<spent> <spent> ..."
--
-- A chunk is "<member>=<free>,<out>,<expires_at>": tokens leased from the global
-- bucket (lua/lease_take.lua; member = the global lease's), of which `free` are
-- in the pool and `out` on instances' sub-leases not yet reported done, spendable
-- until expires_at (this Redis' clock; a chunk dies before its global lease does).
-- A chunk whose tokens are all spent and whose sub-leases are all done is
-- "spent": the next refill retires it at the global store (it no longer counts
-- against the bound there). The credit in use — `used`, requests admitted on
-- credit and not yet released, of which the last `uncharged` not yet charged to
-- the global bucket — lets a region admit the first requests of a key it holds no
-- tokens for at once; charged while the global bucket had room it is released,
-- charged into debt it stays used (no more credit for that key) until a later
-- charge finds the debt repaid. Every region's credit cap times the regions, plus
-- the tokens the global Redis lets out on leases, is the policy's max_overshoot;
-- sub-leases come out of chunks, so they are inside that bound.
--
-- KEYS[i]        the pool of bucket i
-- ARGV[1]        the clock: "" for Redis TIME, "<T" for TIME but only while TIME <= T
--                (a later call changes nothing and returns {2, now}), or µs
-- ARGV[5i-3]     cost of bucket i in tokens (0: only a sub-lease)
-- ARGV[5i-2]     low-water mark of bucket i: below it after this call, the caller
--                is asked to refill (0: never)
-- ARGV[5i-1]     the region's credit cap for bucket i (0: no credit)
-- ARGV[5i]       tokens wanted for the caller's sub-lease of bucket i (0: none)
-- ARGV[5i+1]     the caller's sub-leases of bucket i it is done with (spent out or
--                expired on its own clock: it spends no more of them), as
--                "<member>=<tokens>" separated by spaces
-- ARGV[5n+2]     the refill lock's lifetime in ms (1 ..)
-- ARGV[5n+3]     how long before its chunk a sub-lease ends, µs (the hop back)
-- ARGV[5n+4]     optional, µs (0 ..; 0 when absent): tokens of chunks that die
--                within this long count for nothing against the low-water mark,
--                so a pool is refilled before its chunks die instead of running
--                dry when they do
--
-- A bucket admits from its live chunks (those expiring first first), or else on
-- credit while the credit in use stays within the cap; admitted = 1 when every
-- bucket admits (then all are spent), 0 otherwise (nothing is spent anywhere, no
-- sub-lease is handed out). A sub-lease takes up to the tokens wanted from the
-- chunks expiring first among those living more than twice the horizon, then
-- from the chunks expiring last.
--
-- Returns {admitted, now, then per bucket: tokens left, refill, unconfirmed, k,
-- k x 3 integers, j, j x 5 integers}: refill = 1 when this caller took bucket i's
-- refill lock (one refill at a time per region) — taken when the tokens left that
-- outlive the horizon fall below the low-water mark or credit is in use — and must then charge the
-- `unconfirmed` (uncharged) credit to the global bucket and retire the k spent
-- chunks ({id, tokens, base} of "<id>:<tokens>:<base>") with its take; the j
-- parts of the sub-lease, {id, tokens, base} of their chunk, tokens granted, µs
-- the caller may spend them from now on this Redis' clock. A pool that does not
-- parse counts as empty with all credit in use (its next refill rewrites it):
-- nothing is ever minted.
--
-- Commands run: TIME, one MGET, one SET per bucket.

-- #include clock
local n = #KEYS
if n < 1 or (#ARGV ~= 5 * n + 3 and #ARGV ~= 5 * n + 4) then
  return redis.error_reply('ERR floodgate: pool take expects n keys and 3 + 5 x n or 4 + 5 x n arguments')
end
local now, stale = clock(ARGV[1])
if now == nil then
  return redis.error_reply(BAD_CLOCK)
end
if stale then
  return {2, now}
end
local lock_ms, margin = tonumber(ARGV[5 * n + 2]), tonumber(ARGV[5 * n + 3])
local ahead = tonumber(ARGV[5 * n + 4] or '0')
if not (lock_ms and lock_ms >= 1 and lock_ms % 1 == 0 and margin and margin >= 0
    and ahead and ahead >= 0 and ahead % 1 == 0) then
  return redis.error_reply('ERR floodgate: bad refill lock lifetime, margin or horizon')
end

-- A pool as read: its credit, lock, live chunks and spent members. Corrupt: empty,
-- all credit in use (`cap`).
local function parse(raw, cap)
  local pool = {used = 0, uncharged = 0, lock = 0, chunks = {}, spent = {}}
  if raw == false or raw == nil then return pool end
  local credit, lock, chunks, spent = string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  local u, x = string.match(credit or '', '^(%d+):(%d+)$')
  if not (u and #u <= 15 and #x <= 15 and tonumber(x) <= tonumber(u) and string.find(lock, '^%d+$')) then
    pool.used = cap
    return pool
  end
  pool.used, pool.uncharged, pool.lock = tonumber(u), tonumber(x), tonumber(lock)
  for c in string.gmatch(chunks, '%S+') do
    local member, free, out, at = string.match(c, '^([^=]+)=(%d+),(%d+),(%d+)$')
    if member and #free <= 15 and #out <= 15 and #at <= 16 then
      pool.chunks[#pool.chunks + 1] = {member, tonumber(free), tonumber(out), tonumber(at)}
    end
  end
  for m in string.gmatch(spent, '%S+') do pool.spent[#pool.spent + 1] = m end
  return pool
end

-- Reports of done sub-leases, dead chunks dropped, drained chunks moved to spent.
local function settle(pool, done)
  local back = {}
  for m, k in string.gmatch(done, '([^%s=]+)=(%d+)') do back[m] = (back[m] or 0) + tonumber(k) end
  local live = {}
  for _, c in ipairs(pool.chunks) do
    c[3] = math.max(0, c[3] - (back[c[1]] or 0))
    if c[4] <= now then
      -- expired: its global lease lapses too
    elseif c[2] == 0 and c[3] == 0 then
      pool.spent[#pool.spent + 1] = c[1]
    else
      live[#live + 1] = c
    end
  end
  table.sort(live, function(a, b)
    if a[4] ~= b[4] then return a[4] < b[4] end
    return a[1] < b[1]
  end)
  pool.chunks = live
end

-- Whether a string of digits is an integer a double holds exactly (below 2^53).
local function exact(digits)
  return #digits <= 16 and tonumber(digits) < 9007199254740992
end

local function free(pool)
  local total = 0
  for _, c in ipairs(pool.chunks) do total = total + c[2] end
  return total
end

-- Free tokens of the chunks still live at `at`.
local function lasting(pool, at)
  local total = 0
  for _, c in ipairs(pool.chunks) do
    if c[4] > at then total = total + c[2] end
  end
  return total
end

local function serialize(pool)
  local chunks, last = {}, 0
  for _, c in ipairs(pool.chunks) do
    chunks[#chunks + 1] = c[1] .. '=' .. c[2] .. ',' .. c[3] .. ',' .. string.format('%d', c[4])
    if c[4] > last then last = c[4] end
  end
  local text = pool.used .. ':' .. pool.uncharged .. '|' .. string.format('%d', pool.lock) .. '|'
    .. table.concat(chunks, ' ') .. '|' .. table.concat(pool.spent, ' ')
  return text, last
end

-- Phase 1: read every pool, decide how each bucket would admit.
local raws = redis.call('MGET', unpack(KEYS))
local pools, by_credit = {}, {}
local admitted = 1
for i = 1, n do
  local cost, low, cap, want = tonumber(ARGV[5 * i - 3]), tonumber(ARGV[5 * i - 2]),
    tonumber(ARGV[5 * i - 1]), tonumber(ARGV[5 * i])
  if not (cost and low and cap and want and cost >= 0 and low >= 0 and cap >= 0 and want >= 0
      and cost % 1 == 0 and low % 1 == 0 and cap % 1 == 0 and want % 1 == 0) then
    return redis.error_reply('ERR floodgate: bad cost, low-water mark, credit or want for KEYS[' .. i .. ']')
  end
  local pool = parse(raws[i], cap)
  settle(pool, ARGV[5 * i + 1])
  pools[i] = pool
  if free(pool) >= cost then
    by_credit[i] = false
  elseif pool.used + cost <= cap then
    by_credit[i] = true
  else
    admitted = 0
  end
end

-- Phase 2: spend and lease (all or nothing), hand out refill locks, write.
local reply = {admitted, now}
for i = 1, n do
  local pool = pools[i]
  local cost, low, want = tonumber(ARGV[5 * i - 3]), tonumber(ARGV[5 * i - 2]), tonumber(ARGV[5 * i])
  local parts = {}
  if admitted == 1 and by_credit[i] then
    pool.used, pool.uncharged = pool.used + cost, pool.uncharged + cost
  elseif admitted == 1 then
    local due = cost
    for _, c in ipairs(pool.chunks) do
      local spend = math.min(due, c[2])
      c[2], due = c[2] - spend, due - spend
    end
    -- first from the chunks expiring first among those living more than twice
    -- the horizon (a young chunk is drawn out, then retired, instead of keeping a
    -- remainder behind newer chunks until it dies), then from those expiring last
    local function lease(c, young)
      local life = c[4] - now - margin
      if want > 0 and life > young and c[2] > 0 then
        local k = math.min(want, c[2])
        c[2], c[3], want = c[2] - k, c[3] + k, want - k
        parts[#parts + 1] = {c[1], k, life}
      end
    end
    for j = 1, #pool.chunks do lease(pool.chunks[j], 2 * ahead) end
    for j = #pool.chunks, 1, -1 do lease(pool.chunks[j], 0) end
    settle(pool, '')
  end
  local left = free(pool)
  local refill, unconfirmed, spent = 0, 0, {}
  if (lasting(pool, now + ahead) < low or pool.used > 0) and pool.lock <= now then
    refill, unconfirmed, spent = 1, pool.uncharged, pool.spent
    pool.lock, pool.spent = now + lock_ms * 1000, {}
  end
  local text, last = serialize(pool)
  if pool.used > 0 then
    redis.call('SET', KEYS[i], text) -- credit in use outlives every chunk
  else
    redis.call('SET', KEYS[i], text, 'PX', math.max(1000, math.ceil((math.max(last, pool.lock) - now) / 1000) + 1000))
  end
  reply[#reply + 1] = left
  reply[#reply + 1] = refill
  reply[#reply + 1] = unconfirmed
  local ints = {}
  for _, m in ipairs(spent) do
    -- handed back as integers: each exact in a double (below 2^53). An instance's
    -- lease ids have up to 16 digits (20 random bits above a 32-bit counter); when
    -- this took 15 at most, most spent chunks were dropped here instead of retired,
    -- and held the bound until they died
    local id, tokens, base = string.match(m, '^(%d+):(%d+):(%d+)$')
    if id and exact(id) and exact(tokens) and exact(base) then
      ints[#ints + 1] = tonumber(id)
      ints[#ints + 1] = tonumber(tokens)
      ints[#ints + 1] = tonumber(base)
    end
  end
  reply[#reply + 1] = #ints / 3
  for _, v in ipairs(ints) do reply[#reply + 1] = v end
  reply[#reply + 1] = #parts
  for _, p in ipairs(parts) do
    local id, tokens, base = string.match(p[1], '^(%d+):(%d+):(%d+)$')
    reply[#reply + 1] = tonumber(id) or 0
    reply[#reply + 1] = tonumber(tokens) or 0
    reply[#reply + 1] = tonumber(base) or 0
    reply[#reply + 1] = p[2]
    reply[#reply + 1] = p[3]
  end
end
return reply
