//! UTC calendar periods as pure integer functions: the window a day or a month
//! quota counts in, and the instant it resets.
//!
//! The rules:
//! - a **day** starts at 00:00:00 UTC. Unix time has no leap seconds, so day `n`
//!   since the epoch is exactly `[n × 86,400 s, (n + 1) × 86,400 s)`;
//! - a **month** starts at 00:00:00 UTC on its 1st and ends where the next one
//!   starts (28, 29, 30 or 31 days; proleptic Gregorian leap years: every 4th
//!   year, except centuries, except every 400th);
//! - a **monthly anchor on day `d`** (1-31, as a monthly credits refill names it)
//!   is 00:00:00 UTC on day `d` of a month, or on the month's last day when the
//!   month is shorter (an anchor on the 31st is on 30 April and on 28 or 29
//!   February).
//!
//! Instants are [`Micros`] since the epoch, like every instant the limiter
//! decides on (Redis' `TIME`). The civil-date conversion is Howard Hinnant's
//! `days_from_civil` / `civil_from_days` (integer only, exact for any instant of
//! the `i64` microsecond range), which a Lua script can run with the same floor
//! divisions; it is checked against a table of known dates and against `chrono`.

use serde::{Deserialize, Serialize};

use crate::time::{MICROS_PER_SEC, Micros};

/// One day in microseconds.
pub const DAY: Micros = 86_400 * MICROS_PER_SEC;

/// A calendar period a quota can count in (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalendarPeriod {
    /// From 00:00 UTC to the next 00:00 UTC.
    Day,
    /// From 00:00 UTC on the 1st to 00:00 UTC on the next month's 1st.
    Month,
}

/// The calendar window an instant falls in: `start <= now < reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The instant the window began (00:00 UTC of its day, or of its month's 1st).
    pub start: Micros,
    /// The instant the next window begins: when a quota counted in this one
    /// resets (what `X-RateLimit-Reset` and `Retry-After` point at).
    pub reset: Micros,
}

impl Window {
    /// The window's length (one day, or 28-31 days).
    pub fn length(&self) -> Micros {
        self.reset - self.start
    }

    /// Microseconds from `now` to the reset.
    pub fn until_reset(&self, now: Micros) -> Micros {
        self.reset - now
    }
}

impl CalendarPeriod {
    /// The window of this period that `now` falls in.
    pub fn window(self, now: Micros) -> Window {
        match self {
            CalendarPeriod::Day => day_window(now),
            CalendarPeriod::Month => month_window(now),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CalendarPeriod::Day => "day",
            CalendarPeriod::Month => "month",
        }
    }
}

/// Days since 1970-01-01 of the civil date `year`-`month`-`day` (month 1-12,
/// day 1-31; proleptic Gregorian).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let (month, day) = (i64::from(month), i64::from(day));
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month 1-12, day 1-31)` of a day since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    // both are in range by construction
    (year, month as u32, day as u32)
}

/// Whether `year` has a 29 February.
pub fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// The number of days of `month` (1-12) in `year`.
pub fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The day (since the epoch) `now` falls in.
pub fn day_index(now: Micros) -> i64 {
    now.div_euclid(DAY)
}

/// The UTC day `now` falls in: from its 00:00 to the next day's 00:00.
pub fn day_window(now: Micros) -> Window {
    let start = day_index(now) * DAY;
    Window {
        start,
        reset: start + DAY,
    }
}

/// The month after `year`-`month`.
fn next_month(year: i64, month: u32) -> (i64, u32) {
    if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    }
}

/// The month before `year`-`month`.
fn previous_month(year: i64, month: u32) -> (i64, u32) {
    if month == 1 {
        (year - 1, 12)
    } else {
        (year, month - 1)
    }
}

/// The UTC month `now` falls in: from 00:00 on its 1st to 00:00 on the next
/// month's 1st (December's window resets on 1 January of the next year).
pub fn month_window(now: Micros) -> Window {
    let (year, month, _) = civil_from_days(day_index(now));
    let (next_year, next) = next_month(year, month);
    Window {
        start: days_from_civil(year, month, 1) * DAY,
        reset: days_from_civil(next_year, next, 1) * DAY,
    }
}

/// The anchor on `day` (1-31) of `year`-`month`: 00:00 UTC on that day, or on
/// the month's last day when the month is shorter. `day` 0 counts as 1.
pub fn monthly_anchor(year: i64, month: u32, day: u8) -> Micros {
    let day = u32::from(day).clamp(1, days_in_month(year, month));
    days_from_civil(year, month, day) * DAY
}

/// The window between two consecutive monthly anchors on `day` that `now` falls
/// in: `start` is the latest anchor at or before `now`, `reset` the next one.
pub fn monthly_window(now: Micros, day: u8) -> Window {
    let (year, month, _) = civil_from_days(day_index(now));
    let this = monthly_anchor(year, month, day);
    if now >= this {
        let (y, m) = next_month(year, month);
        Window {
            start: this,
            reset: monthly_anchor(y, m, day),
        }
    } else {
        let (y, m) = previous_month(year, month);
        Window {
            start: monthly_anchor(y, m, day),
            reset: this,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Datelike, NaiveDate};
    use proptest::prelude::*;

    const S: Micros = MICROS_PER_SEC;
    /// ±2^52 µs: about the years 1827 to 2112, the limiter's instant range and more.
    const RANGE: std::ops::Range<Micros> = -(1 << 52)..(1 << 52);

    fn at(y: i64, m: u32, d: u32) -> Micros {
        days_from_civil(y, m, d) * DAY
    }

    #[test]
    fn civil_dates_match_a_table_of_known_unix_times() {
        // (date, Unix seconds at its 00:00 UTC), from `date -u -d <date> +%s`
        let table: [((i64, u32, u32), i64); 10] = [
            ((1970, 1, 1), 0),
            ((1969, 12, 31), -86_400),
            ((1900, 3, 1), -2_203_891_200),
            ((2000, 2, 29), 951_782_400),
            ((2000, 3, 1), 951_868_800),
            ((2024, 2, 29), 1_709_164_800),
            ((2026, 1, 1), 1_767_225_600),
            ((2026, 12, 1), 1_796_083_200),
            ((2100, 3, 1), 4_107_542_400),
            ((2112, 12, 31), 4_512_585_600),
        ];
        for ((y, m, d), secs) in table {
            assert_eq!(days_from_civil(y, m, d) * 86_400, secs, "{y}-{m}-{d}");
            assert_eq!(civil_from_days(secs / 86_400), (y, m, d), "{secs}");
        }
    }

    #[test]
    fn leap_years_follow_the_gregorian_rules() {
        for (year, leap) in [(2024, true), (2026, false), (1900, false), (2000, true)] {
            assert_eq!(is_leap_year(year), leap, "{year}");
            assert_eq!(days_in_month(year, 2), if leap { 29 } else { 28 });
        }
        assert_eq!(
            civil_from_days(days_from_civil(2100, 2, 28) + 1),
            (2100, 3, 1)
        );
        assert_eq!(
            civil_from_days(days_from_civil(2028, 2, 28) + 1),
            (2028, 2, 29)
        );
    }

    #[test]
    fn a_day_resets_at_the_next_midnight_utc() {
        let noon = at(2026, 3, 14) + 12 * 3_600 * S;
        let w = day_window(noon);
        assert_eq!((w.start, w.reset), (at(2026, 3, 14), at(2026, 3, 15)));
        assert_eq!(w.until_reset(noon), 12 * 3_600 * S);
        // the last microsecond of a day is still that day; midnight is the next
        assert_eq!(day_window(at(2026, 3, 15) - 1), w);
        assert_eq!(day_window(at(2026, 3, 15)).start, at(2026, 3, 15));
        assert_eq!(CalendarPeriod::Day.window(noon), w);
    }

    #[test]
    fn a_month_resets_on_the_first_and_december_rolls_into_january() {
        let w = month_window(at(2026, 12, 31) + 23 * 3_600 * S);
        assert_eq!((w.start, w.reset), (at(2026, 12, 1), at(2027, 1, 1)));
        assert_eq!(w.reset, 1_798_761_600 * S, "2027-01-01T00:00:00Z");
        let feb_leap = month_window(at(2028, 2, 29));
        assert_eq!(feb_leap.length(), 29 * DAY);
        assert_eq!(month_window(at(2026, 2, 1)).length(), 28 * DAY);
        assert_eq!(month_window(at(2026, 4, 1) - 1).reset, at(2026, 4, 1));
        assert_eq!(
            CalendarPeriod::Month.window(at(2026, 4, 1)).start,
            at(2026, 4, 1)
        );
    }

    #[test]
    fn an_anchor_on_the_31st_falls_on_the_last_day_of_shorter_months() {
        assert_eq!(monthly_anchor(2026, 4, 31), at(2026, 4, 30));
        assert_eq!(monthly_anchor(2028, 2, 30), at(2028, 2, 29));
        assert_eq!(monthly_anchor(2026, 2, 31), at(2026, 2, 28));
        assert_eq!(monthly_anchor(2026, 5, 15), at(2026, 5, 15));
        // on the 15th: the 14th still belongs to the window that began last month
        let w = monthly_window(at(2026, 5, 14) + 12 * 3_600 * S, 15);
        assert_eq!((w.start, w.reset), (at(2026, 4, 15), at(2026, 5, 15)));
        let w = monthly_window(at(2026, 5, 15), 15);
        assert_eq!((w.start, w.reset), (at(2026, 5, 15), at(2026, 6, 15)));
        // across the year end, anchored on the 31st
        let w = monthly_window(at(2027, 1, 2), 31);
        assert_eq!((w.start, w.reset), (at(2026, 12, 31), at(2027, 1, 31)));
    }

    #[test]
    fn periods_have_their_json_names() {
        for p in [CalendarPeriod::Day, CalendarPeriod::Month] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<CalendarPeriod>(&json).unwrap(), p);
        }
        assert!(serde_json::from_str::<CalendarPeriod>("\"week\"").is_err());
    }

    proptest! {
        #[test]
        fn civil_dates_agree_with_chrono(days in -50_000_000i64..50_000_000) {
            let (y, m, d) = civil_from_days(days);
            prop_assert_eq!(days_from_civil(y, m, d), days);
            let date = DateTime::from_timestamp(days * 86_400, 0).unwrap().date_naive();
            prop_assert_eq!((i64::from(date.year()), date.month(), date.day()), (y, m, d));
            prop_assert_eq!(days_in_month(y, m), last_day_by_chrono(y, m));
        }

        #[test]
        fn a_day_window_holds_now_and_is_one_day_long(now in RANGE) {
            let w = day_window(now);
            prop_assert!(w.start <= now && now < w.reset);
            prop_assert_eq!(w.length(), DAY);
            prop_assert_eq!(w.start.rem_euclid(DAY), 0);
            prop_assert_eq!(day_window(w.reset).start, w.reset);
        }

        #[test]
        fn a_month_window_holds_now_and_is_its_month_long(now in RANGE) {
            let w = month_window(now);
            prop_assert!(w.start <= now && now < w.reset);
            let (y, m, d) = civil_from_days(day_index(w.start));
            prop_assert_eq!(d, 1);
            prop_assert_eq!(w.length(), i64::from(days_in_month(y, m)) * DAY);
            let (ry, rm, rd) = civil_from_days(day_index(w.reset));
            prop_assert_eq!((ry, rm, rd), (if m == 12 { y + 1 } else { y }, m % 12 + 1, 1));
            prop_assert_eq!(month_window(w.reset).start, w.reset);
            prop_assert_eq!(month_window(w.reset - 1), w);
        }

        #[test]
        fn a_monthly_window_runs_from_one_anchor_to_the_next(now in RANGE, day in 1u8..=31) {
            let w = monthly_window(now, day);
            prop_assert!(w.start <= now && now < w.reset);
            prop_assert!((28 * DAY..=31 * DAY).contains(&w.length()));
            prop_assert_eq!(monthly_window(w.reset, day).start, w.reset);
            prop_assert_eq!(monthly_window(w.reset - 1, day), w);
            let (y, m, d) = civil_from_days(day_index(w.start));
            prop_assert_eq!(d, u32::from(day).min(days_in_month(y, m)));
            prop_assert_eq!(w.start.rem_euclid(DAY), 0);
        }
    }

    fn last_day_by_chrono(y: i64, m: u32) -> u32 {
        let (ny, nm) = next_month(y, m);
        let first = NaiveDate::from_ymd_opt(ny as i32, nm, 1).unwrap();
        first.pred_opt().unwrap().day()
    }
}
