//! Traffic counters and the decision sample, kept in memory on the request path
//! and written at chunk cost, off the request path (`waitUntil` in the Worker, a
//! background task natively): one flush per flush interval is ONE call of
//! `lua/stats_flush.lua` (billed: the call, an `HSET` of this instance's field of
//! the current minute's hash — its counts of the minute, whole: rewritten by every
//! flush, so a flush that fails is made good by the next — and the sample's
//! `LPUSH`; once per minute the hash's `EXPIRE` and an `HSET` of the keys' last
//! use; an `LTRIM` once per `SAMPLE_KEEP / 4` decisions sampled). The dashboard
//! reads them. An instance with nothing new writes nothing.
//!
//! Every field, hash and entry is a type of `floodgate_shared::stats` (the contract
//! with the dashboard, round-trip tested): `fg:stats:<minute>` holds each
//! instance's [`MinuteCounts`] (endpoint outcomes, degraded decisions per failure
//! mode, latency, breaker, sample drops, per policy; per 10 seconds the endpoint
//! outcomes and latency; per API key), `fg:key_last_used` each key's last
//! decision, `fg:sample` the sample. `docs/failure.md` lists them with their
//! memory bounds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use rustc_hash::FxBuildHasher;

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::policy::FailureMode;
use floodgate_shared::stats::{
    Counted, Endpoint, EndpointOf, KeyField, MinuteCounts, MinuteWrite, PolicyOutcome, SampleLine,
    StatsWrite, instance_field, latency_index, minute_key,
};
use floodgate_shared::time::{MICROS_PER_SEC, Micros};

use crate::sync::lock;

pub use floodgate_shared::stats::{LATENCY_BOUNDS_US, Leasing, Outcome, StatsField};

/// Where a count goes in a minute's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Minute,
    TenSeconds(i64),
    Key,
}

const MINUTE: Micros = 60 * MICROS_PER_SEC;

/// Where every counted field is also added as it is counted: natively, the
/// instance's Prometheus metrics (`crate::metrics`).
pub trait StatsSink: Send + Sync {
    fn add(&self, field: &StatsField, n: u64);
}

#[derive(Default)]
struct Pending {
    /// Gets every count, before any bound drops it.
    sink: Option<std::sync::Arc<dyn StatsSink>>,
    /// Per Unix minute: this instance's counts of it so far (what its field of
    /// the minute's hash holds once written).
    minutes: BTreeMap<i64, MinuteCounts>,
    /// Minutes counted since they were last written.
    dirty: BTreeSet<i64>,
    /// Minutes whose hash this instance has given its TTL.
    expiring: BTreeSet<i64>,
    /// Recent decisions for the dashboard's backtest.
    sample: Vec<String>,
    /// API key id → Unix seconds of its latest decision, written once a minute.
    last_used: BTreeMap<String, i64>,
    last_used_written: Option<Micros>,
    last_flush: Micros,
    /// A field's name is rendered here (a counter that exists costs no allocation).
    scratch: String,
    /// What the request path counted since the last [`Pending::settle`], typed.
    recent: Recent,
}

impl Pending {
    /// Adds `n` to `field` at `slot` of `minute`, unless that would grow the
    /// minute's counts past their bound (dropping counts beats unbounded memory).
    fn add(&mut self, minute: i64, slot: Slot, field: &str, n: u64) {
        let counts = self.minutes.entry(minute).or_default();
        // the bound is counted only when a counter would be added
        let full = |c: &MinuteCounts| c.len() >= MAX_PENDING;
        let found = match slot {
            Slot::Minute => counts.minute.get_mut(field),
            Slot::TenSeconds(s) => counts.tens.get_mut(&s).and_then(|m| m.get_mut(field)),
            Slot::Key => counts.keys.get_mut(field),
        };
        if let Some(c) = found {
            *c += n;
        } else if full(counts) {
            return;
        } else {
            let map = match slot {
                Slot::Minute => &mut counts.minute,
                Slot::TenSeconds(s) => counts.tens.entry(s).or_default(),
                Slot::Key => &mut counts.keys,
            };
            map.insert(field.to_string(), n);
        }
        self.dirty.insert(minute);
    }

    /// Moves what the request path counted since the last settle into the
    /// minutes' counts (and the sink), each distinct counter named once, and
    /// renders the sample's lines.
    fn settle(&mut self) {
        let recent = std::mem::take(&mut self.recent);
        let name = |i: u32| recent.names.name(i);
        for (t, sum) in &recent.decisions {
            let now = t.ten * TEN_SECONDS;
            let route = t.route.map(name);
            let counted = Counted::Outcome(t.outcome);
            self.count(
                now,
                StatsField::Endpoint(Endpoint::of(route), counted),
                sum.n,
            );
            self.count_key(now, name(t.key), counted, sum.n);
            if let Some(bound) = t.latency {
                let bound = LATENCY_BOUNDS_US[usize::from(bound)];
                self.count(now, StatsField::Latency(bound), sum.n);
                self.count(now, StatsField::LatencySumUs, sum.latency_us);
            }
        }
        for (t, n) in &recent.policies {
            let now = t.minute * MINUTE;
            let policy = name(t.policy).to_string();
            let field = match t.count {
                PolicyCount::Decision(route, outcome) => {
                    StatsField::PolicyDecision(policy, Endpoint::of(route.map(name)), outcome)
                }
                PolicyCount::Leasing(how) => StatsField::Leasing(policy, how),
            };
            self.count(now, field, *n);
        }
        for (ten, n) in &recent.sample_dropped {
            self.count(ten * TEN_SECONDS, StatsField::SampleDropped, *n);
        }
        for (key, secs) in &recent.last_used {
            let room = self.last_used.len() < MAX_PENDING;
            match self.last_used.get_mut(name(*key)) {
                Some(last) => *last = (*last).max(*secs),
                None if room => {
                    self.last_used.insert(name(*key).to_string(), *secs);
                }
                None => {}
            }
        }
    }

    /// Counts `field` at `now`: per minute, and per 10 seconds when it is kept so.
    fn count(&mut self, now: Micros, field: StatsField, n: u64) {
        if let Some(sink) = &self.sink {
            sink.add(&field, n);
        }
        let minute = now.div_euclid(MINUTE);
        // the field's name rendered once, for both of its slots
        let name = self.render(|s| field.write_to(s));
        if field.is_fine() {
            let slot = Slot::TenSeconds(now.div_euclid(10 * MICROS_PER_SEC));
            self.add(minute, slot, &name, n);
        }
        self.add(minute, Slot::Minute, &name, n);
        self.scratch = name;
    }

    fn count_key(&mut self, now: Micros, key_id: &str, counted: Counted, n: u64) {
        let name = self.render(|s| KeyField::write_of(s, key_id, counted));
        self.add(now.div_euclid(MINUTE), Slot::Key, &name, n);
        self.scratch = name;
    }

    /// The scratch buffer, taken (give it back when done), with what `write` wrote.
    fn render(&mut self, write: impl FnOnce(&mut String) -> std::fmt::Result) -> String {
        let mut name = std::mem::take(&mut self.scratch);
        name.clear();
        let _ = write(&mut name);
        name
    }
}

/// The most decisions one instance queues for the sample between flushes.
const MAX_SAMPLE_PENDING: usize = 5_000;

const TEN_SECONDS: Micros = 10 * MICROS_PER_SEC;

/// The names (key ids, plans, routes, policies) of what was counted since the
/// last settle, each kept once: a counter is a few integers.
#[derive(Default)]
struct Names {
    index: HashMap<Box<str>, u32, FxBuildHasher>,
    names: Vec<Box<str>>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.index.insert(name.into(), i);
        i
    }

    fn name(&self, i: u32) -> &str {
        &self.names[i as usize]
    }
}

/// One decision's counters, by 10-second slot: per endpoint, per key, and the
/// store call's latency bucket (an index of [`LATENCY_BOUNDS_US`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct DecisionTally {
    ten: i64,
    key: u32,
    route: Option<u32>,
    outcome: Outcome,
    latency: Option<u8>,
}

#[derive(Debug, Clone, Copy, Default)]
struct DecisionSum {
    n: u64,
    latency_us: u64,
}

/// A per-policy counter, by minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PolicyTally {
    minute: i64,
    policy: u32,
    count: PolicyCount,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PolicyCount {
    Decision(Option<u32>, PolicyOutcome),
    Leasing(Leasing),
}

/// What the request path counted since the last settle: typed counters, named
/// only when settled (at a flush or a scrape), so a request adds to a few
/// integers instead of formatting a counter's name per field.
#[derive(Default)]
struct Recent {
    names: Names,
    decisions: HashMap<DecisionTally, DecisionSum, FxBuildHasher>,
    policies: HashMap<PolicyTally, u64, FxBuildHasher>,
    /// Interned key id → Unix seconds of its latest decision.
    last_used: HashMap<u32, i64, FxBuildHasher>,
    /// Decisions the sample had no room for, by 10-second slot (once the sample
    /// is full, every further decision of the interval lands here).
    sample_dropped: Vec<(i64, u64)>,
}

/// The most counters and names the request path keeps unsettled: past it the
/// request that adds one settles them (bounded memory while no flush runs, such
/// as during an outage).
const MAX_RECENT: usize = 4_096;

impl Recent {
    fn full(&self) -> bool {
        self.decisions.len() + self.policies.len() >= MAX_RECENT
            || self.names.names.len() >= MAX_RECENT
            || self.sample_dropped.len() >= MAX_RECENT
    }
}

/// Counters waiting for the next flush.
pub struct Stats {
    pending: Mutex<Pending>,
    /// This instance's name in the minute hashes (random).
    instance: String,
}

impl Default for Stats {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(&h as *const _ as usize);
        Self {
            pending: Mutex::default(),
            instance: format!("{:016x}", h.finish()),
        }
    }
}

/// The most counters of one minute this instance keeps (bounded memory).
const MAX_PENDING: usize = 10_000;

/// One flush: what it writes, and the minutes it writes (made dirty again if the
/// write fails, so the next flush writes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flush {
    pub write: StatsWrite,
    pub minutes: Vec<i64>,
}

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
        let mut p = lock(&self.pending);
        // the sample's lines are written as they come (a few thousand per flush
        // interval at most: the memory they take is reused by the next ones)
        let sampled = p.sample.len() < MAX_SAMPLE_PENDING;
        if sampled {
            let line = SampleLine {
                at_ms: now / 1000,
                key_id: &key.id,
                plan: &key.plan,
                endpoint: EndpointOf(route),
                outcome,
            };
            let mut text = String::with_capacity(64);
            let _ = line.write_to(&mut text);
            p.sample.push(text);
        }
        let r = &mut p.recent;
        let tally = DecisionTally {
            ten: now.div_euclid(TEN_SECONDS),
            key: r.names.id(&key.id),
            route: route.map(|name| r.names.id(name)),
            outcome,
            latency: store_latency_us.map(|us| latency_index(us) as u8),
        };
        let sum = r.decisions.entry(tally).or_default();
        sum.n += 1;
        sum.latency_us += store_latency_us.unwrap_or(0);
        let last = r.last_used.entry(tally.key).or_insert(i64::MIN);
        *last = (*last).max(now.div_euclid(MICROS_PER_SEC));
        if !sampled {
            let ten = now.div_euclid(TEN_SECONDS);
            match r.sample_dropped.last_mut() {
                Some((t, n)) if *t == ten => *n += 1,
                _ => r.sample_dropped.push((ten, 1)),
            }
        }
        if r.full() {
            p.settle();
        }
    }

    /// Counts a request under each of its policies: `(policy, outcome)`, on
    /// `route`.
    pub fn count_policies<'a>(
        &self,
        now: Micros,
        route: Option<&str>,
        outcomes: impl IntoIterator<Item = (&'a str, PolicyOutcome)>,
    ) {
        self.count_each_policy(now, |names| {
            let route = route.map(|name| names.id(name));
            outcomes
                .into_iter()
                .map(move |(policy, outcome)| (policy, PolicyCount::Decision(route, outcome)))
        });
    }

    /// Counts a request under each of its bounded policies: how it was decided.
    pub fn count_leasing<'a>(
        &self,
        now: Micros,
        policies: impl IntoIterator<Item = &'a str>,
        how: Leasing,
    ) {
        let mut policies = policies.into_iter().peekable();
        if policies.peek().is_none() {
            return;
        }
        self.count_each_policy(now, |_| {
            policies.map(|policy| (policy, PolicyCount::Leasing(how)))
        });
    }

    /// Adds one to each `(policy, count)` that `counts` gives (with the names
    /// interned so far, for those it names itself), in `now`'s minute.
    fn count_each_policy<'a, I: IntoIterator<Item = (&'a str, PolicyCount)>>(
        &self,
        now: Micros,
        counts: impl FnOnce(&mut Names) -> I,
    ) {
        let mut p = lock(&self.pending);
        let r = &mut p.recent;
        let minute = now.div_euclid(MINUTE);
        for (policy, count) in counts(&mut r.names) {
            let tally = PolicyTally {
                minute,
                policy: r.names.id(policy),
                count,
            };
            *r.policies.entry(tally).or_default() += 1;
        }
        if r.full() {
            p.settle();
        }
    }

    /// Moves what requests counted into the minutes' counts and the sink: before
    /// a scrape of the sink (each count reaches it once, and by then).
    pub fn settle(&self) {
        lock(&self.pending).settle();
    }

    /// Counts one decision for a caller the edge could not identify (a key it could
    /// not verify while the store was down, an address refused for its unknown
    /// keys): per endpoint only, not per key, not in the sample.
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
        p.count_key(now, key_id, Counted::ShadowThrottled, 1);
    }

    /// Counts one decision taken without Redis, in `mode`, in total and per endpoint.
    pub fn record_degraded_mode(&self, now: Micros, route: Option<&str>, mode: FailureMode) {
        let mut p = lock(&self.pending);
        p.count(now, StatsField::Mode(mode), 1);
        p.count(now, StatsField::EndpointMode(Endpoint::of(route), mode), 1);
    }

    /// When at least `every` has passed since the last flush and something is
    /// pending: what one flush writes in ONE script call ([`StatsWrite`],
    /// `lua/stats_flush.lua`) — per minute counted since the last flush this
    /// instance's counts of the minute (giving the hash its TTL the first time),
    /// the sample, and at most once a minute the keys' last use.
    pub fn take_due(&self, now: Micros, every: Micros) -> Option<Flush> {
        let mut p = lock(&self.pending);
        p.settle();
        let last_used_due =
            !p.last_used.is_empty() && p.last_used_written.is_none_or(|at| now - at >= MINUTE);
        if (p.dirty.is_empty() && p.sample.is_empty() && !last_used_due)
            || now - p.last_flush < every
        {
            return None;
        }
        p.last_flush = now;
        let dirty: Vec<i64> = std::mem::take(&mut p.dirty).into_iter().collect();
        let mut write = StatsWrite {
            field: instance_field(&self.instance),
            sample: std::mem::take(&mut p.sample),
            ..StatsWrite::default()
        };
        for m in &dirty {
            let counts = p
                .minutes
                .get(m)
                .map(MinuteCounts::to_json)
                .unwrap_or_default();
            let expire = p.expiring.insert(*m);
            write.minutes.push(MinuteWrite {
                key: minute_key(*m),
                counts,
                expire,
            });
        }
        if last_used_due {
            p.last_used_written = Some(now);
            write.last_used = std::mem::take(&mut p.last_used).into_iter().collect();
        }
        // minutes before the last are complete once written
        let current = now.div_euclid(MINUTE);
        p.minutes.retain(|m, _| *m >= current - 1);
        p.expiring.retain(|m| *m >= current - 1);
        Some(Flush {
            write,
            minutes: dirty,
        })
    }

    /// A flush's write failed: its minutes are written again by the next flush
    /// (their counts are whole in each write, so nothing is lost but the sample).
    pub fn unflushed(&self, flush: &Flush) {
        let mut p = lock(&self.pending);
        for m in &flush.minutes {
            if p.minutes.contains_key(m) {
                p.dirty.insert(*m);
                p.expiring.remove(m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::stats::{Minute, SampleEntry, key_minute_key};

    const T: Micros = 1_764_000_000_000_000;

    fn key(id: &str) -> KeyRecord {
        KeyRecord::new(id, "", "free", 1)
    }

    fn route(name: &str, o: Outcome) -> String {
        StatsField::Endpoint(Endpoint::Route(name.into()), Counted::Outcome(o)).to_string()
    }

    /// What a flush wrote of minute hash `hash`, read back as the dashboard does.
    fn minute(write: &StatsWrite, hash: &str) -> MinuteCounts {
        let pairs = write.minutes.iter().filter(|m| m.key == hash).map(|m| {
            (
                write.field.clone().into_bytes(),
                m.counts.clone().into_bytes(),
            )
        });
        Minute::read(pairs).0
    }

    #[test]
    fn a_flush_writes_one_field_per_minute_whatever_was_counted() {
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
        let flush = s.take_due(T, MICROS_PER_SEC).unwrap();
        let batch = &flush.write;
        let writes: Vec<&str> = batch.minutes.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(
            writes.len(),
            2,
            "one field write per minute counted: {batch:?}"
        );
        assert!(writes.iter().all(|k| k.starts_with("fg:stats:")));
        let (m, ten) = (T / 60_000_000, T / 10_000_000);
        let this = minute(batch, &minute_key(m));
        let search = route("search", Outcome::Allowed);
        assert_eq!(this.minute[&search], 2);
        assert_eq!(this.tens[&ten][&search], 2);
        assert_eq!(this.minute["unmatched|throttled"], 1);
        assert_eq!(this.minute["lat:1000"], 2);
        assert_eq!(this.tens[&ten]["lat:inf"], 1);
        assert_eq!(this.keys["k1|allowed"], 2);
        assert_eq!(this.keys["k1|throttled"], 1);
        assert!(
            !this.minute.contains_key("k1|allowed"),
            "keys have their own map"
        );
        let next = minute(batch, &minute_key(m + 1));
        assert_eq!(next.minute[&route("search", Outcome::Degraded)], 1);
        let expires = batch.minutes.iter().filter(|m| m.expire).count();
        assert_eq!(expires, 2, "each minute's hash gets its TTL once");
        let (keys, args) = &batch.calls(true)[0];
        assert_eq!(args[1], "172800", "the minute hash's TTL");
        assert!(
            keys.iter().all(|k| *k != key_minute_key(m)),
            "no separate per-key hash"
        );
        let last: Vec<(&str, i64)> = batch
            .last_used
            .iter()
            .map(|(k, s)| (k.as_str(), *s))
            .collect();
        assert_eq!(last, [("k1", 1764000000), ("k2", 1764000060)]);
        let entries: Vec<SampleEntry> = batch.sample.iter().map(|e| e.parse().unwrap()).collect();
        assert_eq!(entries.len(), 4, "every decision is sampled");
        assert_eq!(entries[2].outcome, Outcome::Throttled);
        assert_eq!(entries[2].endpoint, Endpoint::Unmatched);
        assert_eq!(
            s.take_due(T + 2 * MICROS_PER_SEC, MICROS_PER_SEC),
            None,
            "nothing pending"
        );
    }

    #[test]
    fn each_flush_rewrites_the_minute_whole_and_the_rest_at_their_own_pace() {
        let s = Stats::default();
        let k1 = key("k1");
        s.record(T, None, &k1, Outcome::Allowed, None);
        let first = s.take_due(T, MICROS_PER_SEC).unwrap();
        s.record(T + 1, None, &k1, Outcome::Allowed, None);
        assert_eq!(
            s.take_due(T + MICROS_PER_SEC / 2, MICROS_PER_SEC),
            None,
            "too soon"
        );
        let second = s.take_due(T + 10 * MICROS_PER_SEC, MICROS_PER_SEC).unwrap();
        let m = minute_key(T / 60_000_000);
        assert_eq!(minute(&first.write, &m).minute["unmatched|allowed"], 1);
        assert_eq!(
            minute(&second.write, &m).minute["unmatched|allowed"],
            2,
            "the field holds the minute so far: the second write replaces the first"
        );
        for m in &second.write.minutes {
            assert!(!m.expire, "the TTL was set already: {m:?}");
        }
        assert!(
            second.write.last_used.is_empty(),
            "last use is written once a minute: {:?}",
            second.write
        );
        // a failed write: the next flush writes the minute again
        s.unflushed(&second);
        let again = s.take_due(T + 20 * MICROS_PER_SEC, MICROS_PER_SEC).unwrap();
        assert_eq!(minute(&again.write, &m).minute["unmatched|allowed"], 2);
        assert!(again.write.minutes.iter().any(|m| m.expire), "and its TTL");
        // a minute later the last use goes out again
        s.record(T + 61 * MICROS_PER_SEC, None, &k1, Outcome::Allowed, None);
        let later = s.take_due(T + 61 * MICROS_PER_SEC, MICROS_PER_SEC).unwrap();
        assert!(!later.write.last_used.is_empty());
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
        let flush = s.take_due(T, 1).unwrap();
        let m = minute(&flush.write, &minute_key(T / 60_000_000));
        let field = |f: &str| m.minute.get(f).copied();
        assert_eq!(field("mode:fail_open"), Some(2));
        assert_eq!(field("route:search|degraded:fail_open"), Some(2));
        assert_eq!(field("mode:local_fallback"), Some(1));
        assert_eq!(field("unmatched|degraded:local_fallback"), Some(1));
        assert_eq!(field("breaker:opened"), Some(1));
        assert_eq!(field("breaker:open_ms"), Some(1000));
        assert_eq!(field("mode:fail_closed"), None);
        assert!(m.tens.is_empty(), "per-minute only");
    }

    #[test]
    fn routes_named_like_other_fields_are_counted_as_routes() {
        let s = Stats::default();
        for name in ["mode", "lat", "key", "_"] {
            s.record(T, Some(name), &key("k1"), Outcome::Allowed, None);
        }
        let flush = s.take_due(T, 1).unwrap();
        let m = minute(&flush.write, &minute_key(T / 60_000_000));
        for name in ["mode", "lat", "key", "_"] {
            let f = format!("route:{name}|allowed");
            assert_eq!(m.minute.get(&f), Some(&1), "{f}");
        }
    }

    #[test]
    fn pending_counts_and_the_sample_are_bounded() {
        let s = Stats::default();
        for i in 0..(MAX_PENDING as i64 + 500) {
            s.bump(
                T,
                StatsField::PolicyDecision(
                    format!("p{i}"),
                    Endpoint::Unmatched,
                    floodgate_shared::stats::PolicyOutcome::Allowed,
                ),
                1,
            );
        }
        let flush = s.take_due(T, 1).unwrap();
        let m = minute(&flush.write, &minute_key(T / 60_000_000));
        assert_eq!(m.len(), MAX_PENDING);
        let s = Stats::default();
        for _ in 0..MAX_SAMPLE_PENDING + 7 {
            s.record(T, None, &key("k1"), Outcome::Allowed, None);
        }
        let flush = s.take_due(T, 1).unwrap();
        assert_eq!(flush.write.sample.len(), MAX_SAMPLE_PENDING);
        let m = minute(&flush.write, &minute_key(T / 60_000_000));
        assert_eq!(
            m.minute.get("sample:dropped"),
            Some(&7),
            "what the sample missed is counted"
        );
    }
}
