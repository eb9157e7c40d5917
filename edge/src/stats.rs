//! Traffic counters and the decision sample, kept in memory on the request path
//! and written in ONE batch per flush, off the request path (`waitUntil` in the
//! Worker, a background task natively). The dashboard reads them.
//!
//! Every field, hash and entry is a type of `floodgate_shared::stats` (the contract
//! with the dashboard, round-trip tested): per-minute hashes `fg:stats:<minute>`
//! (endpoint outcomes, degraded decisions per failure mode, latency, breaker,
//! sample drops), per-10-second hashes `fg:stats10:<slot>` (endpoint outcomes and
//! latency only, kept 2 h), per-minute per-API-key hashes `fg:keystats:<minute>`,
//! each key's last decision in `fg:key_last_used`, and the sample `fg:sample`.
//! `docs/failure.md` lists them all with their memory bounds.

use std::collections::BTreeMap;
use std::sync::Mutex;

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::policy::FailureMode;
use floodgate_shared::stats::{
    Counted, Endpoint, KeyField, LAST_USED_KEY, MINUTE_TTL_SECS, SAMPLE_KEEP, SAMPLE_KEY,
    SampleEntry, TEN_SECOND_TTL_SECS, key_minute_key, latency_bound, minute_key, ten_second_key,
};
use floodgate_shared::time::{MICROS_PER_SEC, Micros};

use crate::sync::lock;

pub use floodgate_shared::stats::{LATENCY_BOUNDS_US, Leasing, Outcome, StatsField};

/// Which hash a pending count goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Hash {
    Minute(i64),
    TenSeconds(i64),
    KeyMinute(i64),
}

impl Hash {
    fn key(self) -> String {
        match self {
            Hash::Minute(m) => minute_key(m),
            Hash::TenSeconds(s) => ten_second_key(s),
            Hash::KeyMinute(m) => key_minute_key(m),
        }
    }

    fn ttl_secs(self) -> u64 {
        match self {
            Hash::TenSeconds(_) => TEN_SECOND_TTL_SECS,
            Hash::Minute(_) | Hash::KeyMinute(_) => MINUTE_TTL_SECS,
        }
    }
}

/// Where every counted field is also added as it is counted: natively, the
/// instance's Prometheus metrics (`crate::metrics`).
pub trait StatsSink: Send + Sync {
    fn add(&self, field: &StatsField, n: u64);
}

#[derive(Default)]
struct Pending {
    /// Gets every count, before any bound drops it.
    sink: Option<std::sync::Arc<dyn StatsSink>>,
    /// (hash, field text) → count
    counts: BTreeMap<(Hash, String), u64>,
    /// Recent decisions for the dashboard's backtest.
    sample: Vec<String>,
    /// API key id → Unix seconds of its latest decision.
    last_used: BTreeMap<String, i64>,
    last_flush: Micros,
}

impl Pending {
    /// Adds `n` to `field` of `hash`, unless that would grow the pending counts past
    /// their bound (a flush is overdue; dropping counts beats unbounded memory).
    fn add(&mut self, hash: Hash, field: String, n: u64) {
        if self.counts.len() >= MAX_PENDING && !self.counts.contains_key(&(hash, field.clone())) {
            return;
        }
        *self.counts.entry((hash, field)).or_default() += n;
    }

    /// Counts `field` at `now`: per minute, and per 10 seconds when it is kept so.
    fn count(&mut self, now: Micros, field: StatsField, n: u64) {
        if let Some(sink) = &self.sink {
            sink.add(&field, n);
        }
        if field.is_fine() {
            self.add(
                Hash::TenSeconds(now / (10 * MICROS_PER_SEC)),
                field.to_string(),
                n,
            );
        }
        self.add(
            Hash::Minute(now / (60 * MICROS_PER_SEC)),
            field.to_string(),
            n,
        );
    }

    fn count_key(&mut self, now: Micros, key_id: &str, counted: Counted) {
        let field = KeyField {
            key_id: key_id.to_string(),
            counted,
        };
        self.add(
            Hash::KeyMinute(now / (60 * MICROS_PER_SEC)),
            field.to_string(),
            1,
        );
    }
}

/// The most decisions one instance queues for the sample between flushes.
const MAX_SAMPLE_PENDING: usize = 5_000;

/// Counters waiting for the next flush.
#[derive(Default)]
pub struct Stats {
    pending: Mutex<Pending>,
}

/// The most distinct (hash, field) entries kept between flushes (bounded memory).
const MAX_PENDING: usize = 10_000;

impl Stats {
    /// Adds every count to `sink` as well, from now on.
    pub fn set_sink(&self, sink: std::sync::Arc<dyn StatsSink>) {
        lock(&self.pending).sink = Some(sink);
    }

    /// Counts one decision the edge made at `now` for `key` on `route` (per endpoint
    /// and per key, and the store call's latency when there was one), and adds it
    /// to the sample the dashboard's backtest replays. Every decision goes through
    /// here: Redis's, the recent 429s answered locally, the in-flight limit's and degraded ones.
    pub fn record(
        &self,
        now: Micros,
        route: Option<&str>,
        key: &KeyRecord,
        outcome: Outcome,
        store_latency_us: Option<u64>,
    ) {
        let endpoint = Endpoint::of(route);
        let entry = SampleEntry {
            at_ms: now / 1000,
            key_id: key.id.clone(),
            plan: key.plan.clone(),
            endpoint: endpoint.clone(),
            outcome,
        };
        let mut p = lock(&self.pending);
        p.count(
            now,
            StatsField::Endpoint(endpoint, Counted::Outcome(outcome)),
            1,
        );
        p.count_key(now, &key.id, Counted::Outcome(outcome));
        if let Some(us) = store_latency_us {
            p.count(now, StatsField::Latency(latency_bound(us)), 1);
            p.count(now, StatsField::LatencySumUs, us);
        }
        if p.sample.len() < MAX_SAMPLE_PENDING {
            p.sample.push(entry.to_string());
        } else {
            p.count(now, StatsField::SampleDropped, 1);
        }
        let secs = now.div_euclid(MICROS_PER_SEC);
        if p.last_used.len() < MAX_PENDING || p.last_used.contains_key(&key.id) {
            let last = p.last_used.entry(key.id.clone()).or_default();
            *last = (*last).max(secs);
        }
    }

    /// Counts one decision for a caller the edge could not identify (a key it could
    /// not verify while the store was down): per endpoint only, not per key, not in
    /// the sample.
    pub fn record_unkeyed(&self, now: Micros, route: Option<&str>, outcome: Outcome) {
        lock(&self.pending).count(
            now,
            StatsField::Endpoint(Endpoint::of(route), Counted::Outcome(outcome)),
            1,
        );
    }

    /// Adds `n` to `field` at `now`.
    pub fn bump(&self, now: Micros, field: StatsField, n: u64) {
        if n == 0 {
            return;
        }
        lock(&self.pending).count(now, field, n);
    }

    /// Adds 1 to each of `fields` at `now`, under one lock (a request's per-policy
    /// counts).
    pub fn bump_each(&self, now: Micros, fields: impl IntoIterator<Item = StatsField>) {
        let mut p = lock(&self.pending);
        for field in fields {
            p.count(now, field, 1);
        }
    }

    /// Counts a request a shadow policy would have throttled (it was not enforced).
    pub fn record_shadow(&self, now: Micros, route: Option<&str>, key_id: &str) {
        let mut p = lock(&self.pending);
        p.count(
            now,
            StatsField::Endpoint(Endpoint::of(route), Counted::ShadowThrottled),
            1,
        );
        p.count_key(now, key_id, Counted::ShadowThrottled);
    }

    /// Counts one decision taken without Redis, in `mode`, in total and per endpoint.
    pub fn record_degraded_mode(&self, now: Micros, route: Option<&str>, mode: FailureMode) {
        let mut p = lock(&self.pending);
        p.count(now, StatsField::Mode(mode), 1);
        p.count(now, StatsField::EndpointMode(Endpoint::of(route), mode), 1);
    }

    /// When at least `every` has passed since the last flush and something is
    /// pending: the commands of one batched write (the sample's LPUSH and LTRIM,
    /// HINCRBY per field, EXPIRE per hash, one HSET of the keys' last use). The
    /// counts are taken; a failed write loses them (never blocks).
    pub fn take_due(&self, now: Micros, every: Micros) -> Option<Vec<Vec<String>>> {
        let mut p = lock(&self.pending);
        if (p.counts.is_empty() && p.sample.is_empty()) || now - p.last_flush < every {
            return None;
        }
        p.last_flush = now;
        let counts = std::mem::take(&mut p.counts);
        let sample = std::mem::take(&mut p.sample);
        let last_used = std::mem::take(&mut p.last_used);
        drop(p);
        let mut commands = Vec::with_capacity(counts.len() + 8);
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
        let mut hashes: Vec<Hash> = vec![];
        for ((hash, field), n) in counts {
            if hashes.last() != Some(&hash) {
                hashes.push(hash);
            }
            commands.push(vec!["HINCRBY".into(), hash.key(), field, n.to_string()]);
        }
        for h in hashes {
            commands.push(vec!["EXPIRE".into(), h.key(), h.ttl_secs().to_string()]);
        }
        if !last_used.is_empty() {
            let mut set = vec!["HSET".to_string(), LAST_USED_KEY.to_string()];
            for (id, secs) in last_used {
                set.push(id);
                set.push(secs.to_string());
            }
            commands.push(set);
        }
        Some(commands)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::apikeys::KeyStatus;

    const T: Micros = 1_764_000_000_000_000;

    fn key(id: &str) -> KeyRecord {
        KeyRecord {
            id: id.into(),
            owner: String::new(),
            plan: "free".into(),
            status: KeyStatus::Active,
            created: 1,
        }
    }

    fn route(name: &str, o: Outcome) -> String {
        StatsField::Endpoint(Endpoint::Route(name.into()), Counted::Outcome(o)).to_string()
    }

    /// The count a batch adds to `field` of hash `hash`.
    fn added(batch: &[Vec<String>], hash: &str, field: &str) -> Option<String> {
        batch
            .iter()
            .find(|c| c[0] == "HINCRBY" && c[1] == hash && c[2] == field)
            .map(|c| c[3].clone())
    }

    #[test]
    fn counts_are_batched_per_minute_and_per_ten_seconds_and_flushed_at_most_once_per_interval() {
        let s = Stats::default();
        let k1 = key("k1");
        s.record(T, Some("search"), &k1, Outcome::Allowed, Some(800));
        s.record(T, Some("search"), &k1, Outcome::Allowed, Some(800));
        s.record(T, None, &k1, Outcome::Throttled, Some(20_000_000));
        s.record(
            T + 60 * MICROS_PER_SEC,
            Some("search"),
            &key("k2"),
            Outcome::Degraded,
            None,
        );
        let batch = s.take_due(T, MICROS_PER_SEC).unwrap();
        let (m, ten) = (minute_key(T / 60_000_000), ten_second_key(T / 10_000_000));
        let search = route("search", Outcome::Allowed);
        assert_eq!(added(&batch, &m, &search).as_deref(), Some("2"));
        assert_eq!(added(&batch, &ten, &search).as_deref(), Some("2"));
        assert_eq!(
            added(&batch, &m, "unmatched|throttled").as_deref(),
            Some("1")
        );
        assert_eq!(added(&batch, &m, "lat:1000").as_deref(), Some("2"));
        assert_eq!(added(&batch, &ten, "lat:inf").as_deref(), Some("1"));
        let keys = key_minute_key(T / 60_000_000);
        assert_eq!(added(&batch, &keys, "k1|allowed").as_deref(), Some("2"));
        assert_eq!(added(&batch, &keys, "k1|throttled").as_deref(), Some("1"));
        assert_eq!(
            added(&batch, &m, "k1|allowed"),
            None,
            "keys have their own hash"
        );
        let next = minute_key(T / 60_000_000 + 1);
        assert_eq!(
            added(&batch, &next, &route("search", Outcome::Degraded)).as_deref(),
            Some("1")
        );
        let expires: Vec<&Vec<String>> = batch.iter().filter(|c| c[0] == "EXPIRE").collect();
        assert_eq!(expires.len(), 6, "2 minutes × (minute, 10 s, keys)");
        assert!(expires.iter().any(|c| c[1] == ten && c[2] == "7200"));
        assert!(expires.iter().any(|c| c[1] == m && c[2] == "172800"));
        let last = batch.iter().find(|c| c[0] == "HSET").unwrap();
        assert_eq!(
            last[1..],
            [LAST_USED_KEY, "k1", "1764000000", "k2", "1764000060"]
        );
        let sample = batch.iter().find(|c| c[0] == "LPUSH").unwrap();
        let entries: Vec<SampleEntry> = sample[2..].iter().map(|e| e.parse().unwrap()).collect();
        assert_eq!(entries.len(), 4, "every decision is sampled");
        assert_eq!(entries[2].outcome, Outcome::Throttled);
        assert_eq!(entries[2].endpoint, Endpoint::Unmatched);
        assert_eq!(
            s.take_due(T + 2 * MICROS_PER_SEC, MICROS_PER_SEC),
            None,
            "nothing pending"
        );
        s.record(T, None, &k1, Outcome::Allowed, None);
        assert_eq!(
            s.take_due(T + MICROS_PER_SEC / 2, MICROS_PER_SEC),
            None,
            "too soon"
        );
        assert!(s.take_due(T + MICROS_PER_SEC, MICROS_PER_SEC).is_some());
    }

    #[test]
    fn degraded_modes_and_breaker_fields_are_counted_per_minute() {
        let s = Stats::default();
        s.record_degraded_mode(T, Some("search"), FailureMode::FailOpen);
        s.record_degraded_mode(T, Some("search"), FailureMode::FailOpen);
        s.record_degraded_mode(T, None, FailureMode::LocalFallback);
        s.bump(T, StatsField::BreakerOpened, 1);
        s.bump(T, StatsField::BreakerOpenMs, 700);
        s.bump(T, StatsField::BreakerOpenMs, 300);
        s.bump(T, StatsField::BreakerOpenMs, 0);
        let batch = s.take_due(T, 1).unwrap();
        let m = minute_key(T / 60_000_000);
        let field = |f: &str| added(&batch, &m, f);
        assert_eq!(field("mode:fail_open").as_deref(), Some("2"));
        assert_eq!(
            field("route:search|degraded:fail_open").as_deref(),
            Some("2")
        );
        assert_eq!(field("mode:local_fallback").as_deref(), Some("1"));
        assert_eq!(
            field("unmatched|degraded:local_fallback").as_deref(),
            Some("1")
        );
        assert_eq!(field("breaker:opened").as_deref(), Some("1"));
        assert_eq!(field("breaker:open_ms").as_deref(), Some("1000"));
        assert_eq!(field("mode:fail_closed"), None);
        assert!(
            batch.iter().all(|c| !c[1].starts_with("fg:stats10:")),
            "per-minute only"
        );
    }

    #[test]
    fn routes_named_like_other_fields_are_counted_as_routes() {
        let s = Stats::default();
        for name in ["mode", "lat", "key", "_"] {
            s.record(T, Some(name), &key("k1"), Outcome::Allowed, None);
        }
        let batch = s.take_due(T, 1).unwrap();
        let m = minute_key(T / 60_000_000);
        for name in ["mode", "lat", "key", "_"] {
            let f = format!("route:{name}|allowed");
            assert_eq!(added(&batch, &m, &f).as_deref(), Some("1"), "{f}");
        }
    }

    #[test]
    fn pending_counts_and_the_sample_are_bounded() {
        let s = Stats::default();
        for i in 0..(MAX_PENDING as i64 + 500) {
            s.bump(i * 60 * MICROS_PER_SEC, StatsField::BreakerOpened, 1);
        }
        let batch = s.take_due(i64::MAX / 2, 1).unwrap();
        assert_eq!(
            batch.iter().filter(|c| c[0] == "HINCRBY").count(),
            MAX_PENDING
        );
        let s = Stats::default();
        for _ in 0..MAX_SAMPLE_PENDING + 7 {
            s.record(T, None, &key("k1"), Outcome::Allowed, None);
        }
        let batch = s.take_due(T, 1).unwrap();
        let sample = batch.iter().find(|c| c[0] == "LPUSH").unwrap();
        assert_eq!(sample.len() - 2, MAX_SAMPLE_PENDING);
        let m = minute_key(T / 60_000_000);
        assert_eq!(
            added(&batch, &m, "sample:dropped").as_deref(),
            Some("7"),
            "what the sample missed is counted"
        );
    }
}
