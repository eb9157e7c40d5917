-- UTC calendar arithmetic, the twin of shared/src/calendar.rs (Hinnant's civil
-- dates). Every operand is a whole number >= 0 below 2^53: divisions are exact.
local DAY = 86400000000
local function idiv(a, b) return (a - math.fmod(a, b)) / b end
local function civil(days)
  local z = days + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function days_from(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local doy = idiv(153 * math.fmod(m + 9, 12) + 2, 5) + d - 1
  return era * 146097 + yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy - 719468
end
local function month_days(y, m)
  if m == 2 then
    if math.fmod(y, 4) == 0 and (math.fmod(y, 100) ~= 0 or math.fmod(y, 400) == 0) then return 29 end
    return 28
  end
  if m == 4 or m == 6 or m == 9 or m == 11 then return 30 end
  return 31
end
local function anchor(y, m, day)
  if m == 0 then y, m = y - 1, 12 elseif m == 13 then y, m = y + 1, 1 end
  return days_from(y, m, math.min(day, month_days(y, m))) * DAY
end
-- the window [start, reset) between anchors on `day` of consecutive months holding t
local function monthly(t, day)
  local y, m = civil(idiv(t, DAY))
  local this = anchor(y, m, day)
  if t >= this then return this, anchor(y, m + 1, day) end
  return anchor(y, m - 1, day), this
end
local function daily(t)
  local start = t - math.fmod(t, DAY)
  return start, start + DAY
end
