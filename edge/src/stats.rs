//! Per-endpoint counters (allowed, throttled, degraded) and the latency of the
//! store call, kept in memory on the request path and written in ONE batch per
//! flush, off the request path (`waitUntil` in the Worker, a background task
//! natively). The dashboard reads them.
//!
//! Layout: one hash per minute, `fg:stats:<unix minute>`, fields
//! `<route>|allowed`, `<route>|throttled`, `<route>|degraded` (route `_` when no
//! route matched), the same three per API key id as `key|<id>|<outcome>`, and
//! `lat|<upper bound µs>` (a latency histogram of store calls), expiring after two
//! days. Decisions taken without Redis also count per failure mode, in total
//! (`mode|fail_open`, `mode|fail_closed`, `mode|local_fallback`) and per route
//! (`<route>|degraded|<mode>`); the circuit breaker adds `breaker|opened`
//! (closed → open transitions) and `breaker|open_ms` (ms spent not closed,
//! counted at each flush). `docs/failure.md` lists them all.

use std::collections::BTreeMap;
use std::sync::Mutex;

use floodgate_shared::time::{MICROS_PER_SEC, Micros};

/// Histogram bucket upper bounds (µs) of the store-call latency.
pub const LATENCY_BOUNDS_US: [u64; 12] = [
    250,
    500,
    1_000,
    2_000,
    3_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    1_000_000,
    u64::MAX,
];
/// How long stats stay in Redis.
pub const STATS_TTL_SECS: u64 = 2 * 86_400;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Allowed,
    Throttled,
    Degraded,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Throttled => "throttled",
            Outcome::Degraded => "degraded",
        }
    }
}

#[derive(Default)]
struct Pending {
    /// (minute, field) → count
    counts: BTreeMap<(i64, String), u64>,
    /// Recent decisions for the dashboard's backtest: `<ms>|<key id>|<plan>|<route>`.
    sample: Vec<String>,
    last_flush: Micros,
}

/// The list holding the most recent decisions (newest first), for backtests.
pub const SAMPLE_KEY: &str = "fg:sample";
/// How many decisions the sample keeps (all edges together).
pub const SAMPLE_KEEP: usize = 20_000;
/// The most decisions one instance queues between flushes.
const MAX_SAMPLE_PENDING: usize = 5_000;

/// Counters waiting for the next flush.
#[derive(Default)]
pub struct Stats {
    pending: Mutex<Pending>,
}

/// The most distinct (minute, field) entries kept between flushes (bounded memory).
const MAX_PENDING: usize = 10_000;

impl Stats {
    /// Counts one decision at `now`, and the store call's latency when there was one.
    pub fn record(
        &self,
        now: Micros,
        route: Option<&str>,
        key_id: Option<&str>,
        outcome: Outcome,
        store_latency_us: Option<u64>,
    ) {
        let minute = now / (60 * MICROS_PER_SEC);
        let mut p = self.pending.lock().expect("stats lock");
        if p.counts.len() >= MAX_PENDING {
            return; // a flush is overdue; dropping counts beats unbounded memory
        }
        *p.counts
            .entry((
                minute,
                format!("{}|{}", route.unwrap_or("_"), outcome.name()),
            ))
            .or_default() += 1;
        if let Some(id) = key_id {
            *p.counts
                .entry((minute, format!("key|{id}|{}", outcome.name())))
                .or_default() += 1;
        }
        if let Some(us) = store_latency_us {
            let bound = LATENCY_BOUNDS_US
                .iter()
                .find(|b| us <= **b)
                .copied()
                .unwrap_or(u64::MAX);
            let label = if bound == u64::MAX {
                "inf".to_string()
            } else {
                bound.to_string()
            };
            *p.counts
                .entry((minute, format!("lat|{label}")))
                .or_default() += 1;
        }
    }

    /// Adds `n` to an arbitrary `field` of `now`'s minute.
    pub fn bump(&self, now: Micros, field: String, n: u64) {
        if n == 0 {
            return;
        }
        let minute = now / (60 * MICROS_PER_SEC);
        let mut p = self.pending.lock().expect("stats lock");
        if p.counts.len() >= MAX_PENDING && !p.counts.contains_key(&(minute, field.clone())) {
            return;
        }
        *p.counts.entry((minute, field)).or_default() += n;
    }

    /// Counts a request a shadow policy would have throttled (it was not enforced).
    pub fn record_shadow(&self, now: Micros, route: Option<&str>, key_id: &str) {
        self.bump(now, format!("{}|shadow_throttled", route.unwrap_or("_")), 1);
        self.bump(now, format!("key|{key_id}|shadow_throttled"), 1);
    }

    /// Keeps one decided request (its key, plan and route at `now`) for backtests.
    pub fn sample(&self, now: Micros, key_id: &str, plan: &str, route: Option<&str>) {
        let mut p = self.pending.lock().expect("stats lock");
        if p.sample.len() < MAX_SAMPLE_PENDING {
            let entry = format!("{}|{key_id}|{plan}|{}", now / 1000, route.unwrap_or("_"));
            p.sample.push(entry);
        }
    }

    /// Counts one decision taken without Redis, in `mode` (`fail_open`, ...).
    pub fn record_degraded_mode(&self, now: Micros, route: Option<&str>, mode: &str) {
        self.bump(now, format!("mode|{mode}"), 1);
        self.bump(now, format!("{}|degraded|{mode}", route.unwrap_or("_")), 1);
    }

    /// When at least `every` has passed since the last flush and something is
    /// pending: the commands of one batched write (HINCRBY per field, EXPIRE per
    /// minute). The counts are taken; a failed write loses them (never blocks).
    pub fn take_due(&self, now: Micros, every: Micros) -> Option<Vec<Vec<String>>> {
        let mut p = self.pending.lock().expect("stats lock");
        if (p.counts.is_empty() && p.sample.is_empty()) || now - p.last_flush < every {
            return None;
        }
        p.last_flush = now;
        let counts = std::mem::take(&mut p.counts);
        let sample = std::mem::take(&mut p.sample);
        drop(p);
        let mut commands = Vec::with_capacity(counts.len() + 4);
        if !sample.is_empty() {
            let mut push = vec!["LPUSH".to_string(), SAMPLE_KEY.to_string()];
            push.extend(sample);
            commands.push(push);
            commands.push(vec![
                "LTRIM".into(),
                SAMPLE_KEY.into(),
                "0".into(),
                (SAMPLE_KEEP - 1).to_string(),
            ]);
        }
        let mut minutes = vec![];
        for ((minute, field), n) in counts {
            if minutes.last() != Some(&minute) {
                minutes.push(minute);
            }
            commands.push(vec![
                "HINCRBY".into(),
                stats_key(minute),
                field,
                n.to_string(),
            ]);
        }
        for m in minutes {
            commands.push(vec![
                "EXPIRE".into(),
                stats_key(m),
                STATS_TTL_SECS.to_string(),
            ]);
        }
        Some(commands)
    }
}

/// The hash holding one minute's counters.
pub fn stats_key(minute: i64) -> String {
    format!("fg:stats:{minute}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_batched_per_minute_and_flushed_at_most_once_per_interval() {
        let s = Stats::default();
        let t = 1_764_000_000_000_000;
        s.record(t, Some("search"), Some("k1"), Outcome::Allowed, Some(800));
        s.record(t, Some("search"), Some("k1"), Outcome::Allowed, Some(800));
        s.record(t, None, Some("k1"), Outcome::Throttled, Some(20_000_000));
        s.record(
            t + 60 * MICROS_PER_SEC,
            Some("search"),
            None,
            Outcome::Degraded,
            None,
        );
        let batch = s.take_due(t, MICROS_PER_SEC).unwrap();
        let m = t / 60_000_000;
        assert!(batch.contains(&vec![
            "HINCRBY".into(),
            stats_key(m),
            "search|allowed".into(),
            "2".into()
        ]));
        assert!(batch.contains(&vec![
            "HINCRBY".into(),
            stats_key(m),
            "_|throttled".into(),
            "1".into()
        ]));
        assert!(batch.contains(&vec![
            "HINCRBY".into(),
            stats_key(m),
            "lat|1000".into(),
            "2".into()
        ]));
        assert!(batch.contains(&vec![
            "HINCRBY".into(),
            stats_key(m),
            "lat|inf".into(),
            "1".into()
        ]));
        for (field, n) in [("key|k1|allowed", "2"), ("key|k1|throttled", "1")] {
            assert!(batch.contains(&vec![
                "HINCRBY".into(),
                stats_key(m),
                field.into(),
                n.into()
            ]));
        }
        assert!(batch.contains(&vec![
            "HINCRBY".into(),
            stats_key(m + 1),
            "search|degraded".into(),
            "1".into()
        ]));
        assert_eq!(batch.iter().filter(|c| c[0] == "EXPIRE").count(), 2);
        assert_eq!(
            s.take_due(t + 2 * MICROS_PER_SEC, MICROS_PER_SEC),
            None,
            "nothing pending"
        );
        s.record(t, None, None, Outcome::Allowed, None);
        assert_eq!(
            s.take_due(t + MICROS_PER_SEC / 2, MICROS_PER_SEC),
            None,
            "too soon"
        );
        assert!(s.take_due(t + MICROS_PER_SEC, MICROS_PER_SEC).is_some());
    }

    #[test]
    fn degraded_modes_and_breaker_fields_are_counted_per_minute() {
        let s = Stats::default();
        let t = 1_764_000_000_000_000;
        s.record_degraded_mode(t, Some("search"), "fail_open");
        s.record_degraded_mode(t, Some("search"), "fail_open");
        s.record_degraded_mode(t, None, "local_fallback");
        s.bump(t, "breaker|opened".into(), 1);
        s.bump(t, "breaker|open_ms".into(), 700);
        s.bump(t, "breaker|open_ms".into(), 300);
        s.bump(t, "breaker|open_ms".into(), 0);
        let batch = s.take_due(t, 1).unwrap();
        let m = t / 60_000_000;
        let field = |f: &str| {
            batch
                .iter()
                .find(|c| c[0] == "HINCRBY" && c[1] == stats_key(m) && c[2] == f)
                .map(|c| c[3].clone())
        };
        assert_eq!(field("mode|fail_open").as_deref(), Some("2"));
        assert_eq!(field("search|degraded|fail_open").as_deref(), Some("2"));
        assert_eq!(field("mode|local_fallback").as_deref(), Some("1"));
        assert_eq!(field("_|degraded|local_fallback").as_deref(), Some("1"));
        assert_eq!(field("breaker|opened").as_deref(), Some("1"));
        assert_eq!(field("breaker|open_ms").as_deref(), Some("1000"));
        assert_eq!(field("mode|fail_closed"), None);
    }

    #[test]
    fn pending_counts_are_bounded() {
        let s = Stats::default();
        for i in 0..(MAX_PENDING as i64 + 500) {
            s.record(i * 60 * MICROS_PER_SEC, None, None, Outcome::Allowed, None);
        }
        let batch = s.take_due(i64::MAX / 2, 1).unwrap();
        assert_eq!(
            batch.iter().filter(|c| c[0] == "HINCRBY").count(),
            MAX_PENDING
        );
    }
}
