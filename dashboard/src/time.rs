//! Every time the dashboard shows, through chrono: UTC with the zone named, and the
//! browser's local time where a page offers it (after hydration; the server does
//! not know the reader's zone).

use chrono::{DateTime, FixedOffset, Utc};

fn at(secs: i64) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(secs, 0)
}

/// `2026-11-30 16:05:12 UTC`.
pub fn utc(secs: i64) -> String {
    at(secs).map_or_else(
        || format!("(invalid time {secs})"),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// `16:05 UTC` (`16:05:10 UTC` when `seconds`).
pub fn utc_time(secs: i64, seconds: bool) -> String {
    let fmt = if seconds { "%H:%M:%S UTC" } else { "%H:%M UTC" };
    at(secs).map_or_else(String::new, |t| t.format(fmt).to_string())
}

/// `16:05` (axis labels; the axis names the zone).
pub fn hh_mm(secs: i64) -> String {
    at(secs).map_or_else(String::new, |t| t.format("%H:%M").to_string())
}

/// RFC 3339 (`2026-11-30T16:05:12Z`), for `<time datetime>`.
pub fn rfc3339(secs: i64) -> String {
    at(secs).map_or_else(String::new, |t| {
        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    })
}

/// The time at `secs` in a zone `offset_minutes` east of UTC:
/// `2026-11-30 17:05:12 (UTC+01:00)`.
pub fn in_offset(secs: i64, offset_minutes: i32) -> String {
    let Some(zone) = FixedOffset::east_opt(offset_minutes * 60) else {
        return utc(secs);
    };
    at(secs).map_or_else(String::new, |t| {
        t.with_timezone(&zone)
            .format("%Y-%m-%d %H:%M:%S (UTC%:z)")
            .to_string()
    })
}

/// The browser's local time at `secs` (its zone's offset at that instant, so
/// daylight saving time is right for past dates); `None` on the server.
pub fn local(secs: i64) -> Option<String> {
    #[cfg(feature = "hydrate")]
    {
        let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(secs as f64 * 1000.0));
        // getTimezoneOffset is minutes WEST of UTC
        Some(in_offset(secs, -(date.get_timezone_offset() as i32)))
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = secs;
        None
    }
}

/// How long ago `secs` was at `now`: `just now`, `42 s ago`, `5 min ago`, `3 h ago`,
/// `2 days ago`.
pub fn ago(secs: i64, now: i64) -> String {
    let d = (now - secs).max(0);
    match d {
        0..=4 => "just now".to_string(),
        5..=59 => format!("{d} s ago"),
        60..=3_599 => format!("{} min ago", d / 60),
        3_600..=86_399 => format!("{} h ago", d / 3_600),
        _ => format!("{} days ago", d / 86_400),
    }
}

/// Now, in Unix seconds (the server's clock, or the browser's).
pub fn now_secs() -> i64 {
    #[cfg(feature = "hydrate")]
    {
        (js_sys::Date::now() / 1000.0) as i64
    }
    #[cfg(not(feature = "hydrate"))]
    {
        Utc::now().timestamp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_show_their_zone() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_000_000), "2026-11-30 00:53:20 UTC");
        assert_eq!(utc(951_825_600), "2000-02-29 12:00:00 UTC");
        assert_eq!(rfc3339(1_796_000_000), "2026-11-30T00:53:20Z");
        assert_eq!(utc_time(1_796_000_000, false), "00:53 UTC");
        assert_eq!(hh_mm(1_796_000_000), "00:53");
        assert_eq!(
            in_offset(1_796_000_000, 60),
            "2026-11-30 01:53:20 (UTC+01:00)"
        );
        assert_eq!(
            in_offset(1_796_000_000, -330),
            "2026-11-29 19:23:20 (UTC-05:30)"
        );
        assert_eq!(local(0), None, "the server does not know the reader's zone");
        assert!(utc(i64::MAX).contains("invalid"));
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(ago(100, 102), "just now");
        assert_eq!(ago(100, 142), "42 s ago");
        assert_eq!(ago(0, 300), "5 min ago");
        assert_eq!(ago(0, 3 * 3_600 + 5), "3 h ago");
        assert_eq!(ago(0, 2 * 86_400), "2 days ago");
        assert_eq!(ago(10, 0), "just now", "a clock behind is not the future");
    }
}
