//! What the edges recorded, read from Redis and summed for the pages (feature
//! `ssr`): the per-minute stats hashes (`fg:stats:*`: each edge instance's counts
//! of the minute — per minute, per 10 seconds, per key — read with
//! [`Minute::read`], and what older edges wrote as separate counters and hashes),
//! each key's last use and the sample of recent decisions. The
//! only module that knows how traffic statistics are stored: the rest of the
//! dashboard asks it for [`Traffic`], [`PolicyLeasing`] rows, [`KeyUsage`], the
//! sample, or (for the fleet's `/metrics`) the raw fields of recent minutes.

use std::collections::BTreeMap;

use floodgate_edge::store::{NativeStore, Store, StoreError};
use floodgate_shared::config::{ConfigSpec, EdgeConfig};
use floodgate_shared::stats::{
    Counted, Endpoint, KeyField, LAST_USED_KEY, Minute, Outcome, SAMPLE_KEEP, SAMPLE_KEY,
    SampleEntry, StatsField, key_minute_key, minute_key, ten_second_key,
};

use super::leasing::PolicyLeasing;
use super::range::{Range, Resolution, bars};
use super::series::{Series, Traffic, histogram_quantile};

/// A stats hash's fields and their counts.
pub type Fields = Vec<(String, u64)>;

/// One key's decisions over a span: allowed, throttled (429), degraded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyUsage {
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
}

/// A hash's fields and their counts (non-numbers skipped).
fn counts(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Fields {
    pairs
        .into_iter()
        .filter_map(|(k, v)| {
            let n = String::from_utf8_lossy(&v).parse::<u64>().ok()?;
            Some((String::from_utf8_lossy(&k).into_owned(), n))
        })
        .collect()
}

/// The minutes `minutes` (Unix minutes), in that order, as every instance
/// counted them: each minute's hash and an older edge's per-key hash of it (one
/// batched round trip).
async fn read_minutes(store: &NativeStore, minutes: &[i64]) -> Result<Vec<Minute>, StoreError> {
    let keys: Vec<String> = minutes
        .iter()
        .flat_map(|m| [minute_key(*m), key_minute_key(*m)])
        .collect();
    let mut read = store.hgetall_many(&keys).await?.into_iter();
    let mut out = Vec::with_capacity(minutes.len());
    while let (Some(minute), Some(keyed)) = (read.next(), read.next()) {
        let mut m = Minute::read(minute);
        m.add_legacy_keys(keyed);
        out.push(m);
    }
    Ok(out)
}

fn fields(map: &BTreeMap<String, u64>) -> Fields {
    map.iter().map(|(k, n)| (k.clone(), *n)).collect()
}

/// The per-minute fields of `minutes`, in that order: what the fleet's
/// `/metrics` adds up.
pub async fn minutes(store: &NativeStore, minutes: &[i64]) -> Result<Vec<Fields>, StoreError> {
    Ok(read_minutes(store, minutes)
        .await?
        .iter()
        .map(|m| fields(&m.0.minute))
        .collect())
}

/// The per-10-second fields of the slots `slots` (Unix seconds / 10), in that
/// order: from the minutes holding them, and an older edge's per-slot hashes.
async fn ten_seconds(store: &NativeStore, slots: &[i64]) -> Result<Vec<Fields>, StoreError> {
    let first = slots.first().map_or(0, |s| (s * 10).div_euclid(60));
    let last = slots.last().map_or(0, |s| (s * 10).div_euclid(60));
    let ms: Vec<i64> = (first..=last).collect();
    let read = read_minutes(store, &ms).await?;
    let legacy_keys: Vec<String> = slots.iter().map(|s| ten_second_key(*s)).collect();
    let legacy = store.hgetall_many(&legacy_keys).await?;
    Ok(slots
        .iter()
        .zip(legacy)
        .map(|(slot, old)| {
            let m = &read[((slot * 10).div_euclid(60) - first) as usize];
            let mut tens = m.0.tens.get(slot).cloned().unwrap_or_default();
            for (f, n) in counts(old) {
                *tens.entry(f).or_default() += n;
            }
            fields(&tens)
        })
        .collect())
}

/// The per-key fields of `minutes`, in that order.
async fn key_minutes(store: &NativeStore, minutes: &[i64]) -> Result<Vec<Fields>, StoreError> {
    Ok(read_minutes(store, minutes)
        .await?
        .iter()
        .map(|m| fields(&m.0.keys))
        .collect())
}

/// Each API key's latest decision (Unix seconds).
pub async fn last_used(store: &NativeStore) -> Result<BTreeMap<String, i64>, StoreError> {
    let hashes = store.hgetall_many(&[LAST_USED_KEY.to_string()]).await?;
    Ok(counts(hashes.into_iter().next().unwrap_or_default())
        .into_iter()
        .map(|(id, secs)| (id, secs as i64))
        .collect())
}

/// Route name → path pattern, as the pages name endpoints.
pub fn route_patterns(spec: &ConfigSpec) -> BTreeMap<String, String> {
    spec.routes
        .iter()
        .map(|r| (r.name.clone(), r.pattern.clone()))
        .collect()
}

/// The bounded and `auto` policies of `config`, with their bounds and what the
/// global store leases of each (the edge's own `LeaseSettings::for_policy`, so the
/// dashboard cannot drift from it), their counts still zero.
fn leasing_policies(config: &EdgeConfig) -> Vec<PolicyLeasing> {
    use floodgate_edge::pipeline::leases::LeaseSettings;
    use floodgate_shared::policy::Consistency;
    let mut rows: Vec<PolicyLeasing> = config
        .spec()
        .policies
        .iter()
        .filter_map(|spec| {
            let p = config.policy(&spec.name)?;
            let bound = p
                .max_overshoot()
                .filter(|_| p.consistency() != Consistency::Exact)?;
            Some(PolicyLeasing {
                policy: spec.name.clone(),
                consistency: p.consistency(),
                bound,
                leasable: LeaseSettings::default()
                    .for_policy(p, config.regions())
                    .max_overshoot,
                local: 0,
                exact: 0,
                refills: 0,
                outstanding: 0,
            })
        })
        .collect();
    rows.sort_by(|a, b| a.policy.cmp(&b.policy));
    rows
}

/// Adds the edges' per-policy consistency counters of `hashes` (per-minute hashes'
/// fields, read through [`StatsField`]) to `rows` (pure).
fn count_leasing(rows: &mut [PolicyLeasing], hashes: &[Fields]) {
    use floodgate_shared::stats::Leasing;
    for (field, n) in hashes.iter().flatten() {
        let Ok(StatsField::Leasing(policy, what)) = field.parse::<StatsField>() else {
            continue;
        };
        let Some(row) = rows.iter_mut().find(|r| r.policy == policy) else {
            continue; // a policy no longer bounded, or gone
        };
        let counter = match what {
            Leasing::Local => &mut row.local,
            Leasing::Exact => &mut row.exact,
            Leasing::Refills => &mut row.refills,
            Leasing::Outstanding => &mut row.outstanding,
        };
        *counter = counter.saturating_add(*n);
    }
}

/// The figures of the bounded and `auto` policies of `config` over `range` ending
/// with the minute of `now`: the range's per-minute hashes (none read when no
/// policy is bounded).
pub async fn leasing(
    store: &NativeStore,
    now: i64,
    range: Range,
    config: &EdgeConfig,
) -> Result<Vec<PolicyLeasing>, StoreError> {
    let mut rows = leasing_policies(config);
    if !rows.is_empty() {
        let (start, n) = bars(now, range, Resolution::Minute1);
        let read: Vec<i64> = (0..n as i64).map(|i| start.div_euclid(60) + i).collect();
        count_leasing(&mut rows, &minutes(store, &read).await?);
    }
    Ok(rows)
}

/// Reads what the traffic page draws: the per-10-second hashes at 10 s, else the
/// per-minute hashes summed into bars, and the most throttled keys of the last
/// hour at most (their per-minute hashes).
pub async fn read(
    store: &NativeStore,
    now: i64,
    range: Range,
    resolution: Resolution,
    patterns: BTreeMap<String, String>,
) -> Result<Traffic, StoreError> {
    let (start, n) = bars(now, range, resolution);
    let end = start + n as i64 * resolution.secs();
    let (read, starts): (Vec<Fields>, Vec<i64>) = if resolution == Resolution::Seconds10 {
        let slots: Vec<i64> = (start / 10..end / 10).collect();
        (
            ten_seconds(store, &slots).await?,
            slots.iter().map(|s| s * 10).collect(),
        )
    } else {
        let ms: Vec<i64> = (start / 60..end / 60).collect();
        (
            minutes(store, &ms).await?,
            ms.iter().map(|m| m * 60).collect(),
        )
    };
    let timed: Vec<(i64, Fields)> = starts.into_iter().zip(read).collect();
    let top_minutes = (range.secs() / 60).min(60) as u32;
    let minute = now.div_euclid(60);
    let recent: Vec<i64> = (0..top_minutes as i64).map(|i| minute - i).collect();
    let keys_read = key_minutes(store, &recent).await?;
    let mut t = summarize(start, resolution, n, &timed);
    t.range = range;
    t.patterns = patterns;
    t.top_minutes = top_minutes;
    t.top_throttled = top_throttled(&keys_read);
    Ok(t)
}

/// What the stats hashes of one range add up to, before it becomes [`Traffic`].
struct Sums {
    endpoints: BTreeMap<Endpoint, Series>,
    /// Per bar: the latency histogram's (bucket bound, count).
    hist: Vec<Vec<(u64, u64)>>,
    by_mode: BTreeMap<floodgate_shared::policy::FailureMode, u64>,
    by_endpoint_mode: BTreeMap<(Endpoint, floodgate_shared::policy::FailureMode), u64>,
    opened: u64,
    open_ms: u64,
    denied: BTreeMap<floodgate_shared::deny::DenyList, u64>,
}

impl Sums {
    fn new(n: usize) -> Self {
        Sums {
            endpoints: BTreeMap::new(),
            hist: vec![vec![]; n],
            by_mode: BTreeMap::new(),
            by_endpoint_mode: BTreeMap::new(),
            opened: 0,
            open_ms: 0,
            denied: BTreeMap::new(),
        }
    }

    /// Adds `count` of `field` to bar `i` of `n`.
    fn add(&mut self, i: usize, n: usize, field: StatsField, count: u64) {
        match field {
            StatsField::Endpoint(e, counted) => {
                let s = self.endpoints.entry(e).or_insert_with(|| Series::zeros(n));
                let v = match counted {
                    Counted::Outcome(Outcome::Allowed) => &mut s.allowed,
                    Counted::Outcome(Outcome::Throttled) => &mut s.throttled,
                    Counted::Outcome(Outcome::Degraded) => &mut s.degraded,
                    Counted::ShadowThrottled => &mut s.shadow,
                };
                v[i] += count;
            }
            StatsField::EndpointMode(e, m) => {
                *self.by_endpoint_mode.entry((e, m)).or_default() += count
            }
            StatsField::Mode(m) => *self.by_mode.entry(m).or_default() += count,
            StatsField::Latency(b) => self.hist[i].push((b, count)),
            StatsField::BreakerOpened => self.opened += count,
            StatsField::BreakerOpenMs => self.open_ms += count,
            StatsField::Denied(list) => *self.denied.entry(list).or_default() += count,
            // per-policy consistency figures: per minute, by `leasing`; decisions
            // per policy: the fleet's /metrics
            StatsField::SampleDropped
            | StatsField::LatencySumUs
            | StatsField::Leasing(..)
            | StatsField::PolicyDecision(..) => {}
        }
    }

    fn into_traffic(self, start: i64, resolution: Resolution, n: usize) -> Traffic {
        Traffic {
            range: Range::Minutes15,
            resolution,
            start,
            bars: n,
            endpoints: self.endpoints.into_iter().collect(),
            patterns: BTreeMap::new(),
            top_throttled: vec![],
            top_minutes: 0,
            p50_us: self
                .hist
                .iter()
                .map(|h| histogram_quantile(h, 0.5))
                .collect(),
            p99_us: self
                .hist
                .iter()
                .map(|h| histogram_quantile(h, 0.99))
                .collect(),
            degraded_by_mode: self.by_mode.into_iter().collect(),
            degraded_by_endpoint_mode: self
                .by_endpoint_mode
                .into_iter()
                .map(|((e, m), n)| (e, m, n))
                .collect(),
            breaker_opened: self.opened,
            breaker_open_ms: self.open_ms,
            denied: self.denied.into_iter().collect(),
        }
    }
}

/// Turns hashes `(their start, fields)` into the bars the charts draw (pure).
fn summarize(start: i64, resolution: Resolution, n: usize, hashes: &[(i64, Fields)]) -> Traffic {
    let step = resolution.secs();
    let mut sums = Sums::new(n);
    for (at, fields) in hashes {
        let Ok(i) = usize::try_from((at - start).div_euclid(step)) else {
            continue;
        };
        if i >= n {
            continue;
        }
        for (field, count) in fields {
            // another version's field: not ours to guess
            if let Ok(field) = field.parse::<StatsField>() {
                sums.add(i, n, field, *count);
            }
        }
    }
    sums.into_traffic(start, resolution, n)
}

/// Per key: its decisions summed over per-key hashes.
fn key_usage(hashes: &[Fields]) -> BTreeMap<String, KeyUsage> {
    let mut out: BTreeMap<String, KeyUsage> = BTreeMap::new();
    for (field, n) in hashes.iter().flatten() {
        let Ok(KeyField { key_id, counted }) = field.parse::<KeyField>() else {
            continue;
        };
        let e = out.entry(key_id).or_default();
        match counted {
            Counted::Outcome(Outcome::Allowed) => e.allowed += n,
            Counted::Outcome(Outcome::Throttled) => e.throttled += n,
            Counted::Outcome(Outcome::Degraded) => e.degraded += n,
            Counted::ShadowThrottled => {}
        }
    }
    out
}

/// The ten keys with the most 429s in the per-key hashes, most first.
fn top_throttled(hashes: &[Fields]) -> Vec<(String, u64)> {
    let mut top: Vec<(String, u64)> = key_usage(hashes)
        .into_iter()
        .filter(|(_, u)| u.throttled > 0)
        .map(|(id, u)| (id, u.throttled))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(10);
    top
}

/// Per key: its decisions over the last `minutes` minutes.
pub async fn usage(
    store: &NativeStore,
    now: i64,
    minutes: i64,
) -> Result<BTreeMap<String, KeyUsage>, StoreError> {
    let minute = now.div_euclid(60);
    let recent: Vec<i64> = (0..minutes).map(|i| minute - i).collect();
    Ok(key_usage(&key_minutes(store, &recent).await?))
}

/// Decisions the edges could not add to the sample between `from_ms` and `to_ms`
/// (field `sample_dropped` of each minute's hash, summed; one batched round trip).
pub async fn sample_dropped(
    store: &NativeStore,
    from_ms: i64,
    to_ms: i64,
) -> Result<u64, StoreError> {
    let field = StatsField::SampleDropped.to_string();
    let ms: Vec<i64> = (from_ms.div_euclid(60_000)..=to_ms.div_euclid(60_000)).collect();
    Ok(minutes(store, &ms)
        .await?
        .iter()
        .flatten()
        .filter(|(f, _)| *f == field)
        .map(|(_, n)| *n)
        .sum())
}

/// The edge's sample of recent decisions, oldest first (entries that do not
/// parse are skipped): the newest [`SAMPLE_KEEP`] (the list holds up to a quarter
/// more between its trims).
pub async fn sample(store: &NativeStore) -> Result<Vec<SampleEntry>, StoreError> {
    let items = store.lrange(SAMPLE_KEY, 0, SAMPLE_KEEP as i64 - 1).await?;
    let mut entries: Vec<SampleEntry> = items
        .iter()
        .filter_map(|b| std::str::from_utf8(b).ok()?.parse().ok())
        .collect();
    entries.reverse(); // the list is newest first
    entries.sort_by_key(|e| e.at_ms); // edges flush independently
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_is_summarized_per_endpoint_into_bars() {
        let hashes = vec![
            (
                600,
                vec![
                    ("route:search|allowed".to_string(), 5),
                    ("route:search|throttled".to_string(), 2),
                    ("route:search|degraded:fail_open".to_string(), 9),
                    ("route:search|shadow_throttled".to_string(), 4),
                    ("route:mode|allowed".to_string(), 3),
                    ("route:_|allowed".to_string(), 6),
                    ("lat:250".to_string(), 7),
                    ("mode:fail_open".to_string(), 9),
                    ("breaker:opened".to_string(), 1),
                    ("breaker:open_ms".to_string(), 1500),
                    ("denied:ip".to_string(), 4),
                    ("search|allowed".to_string(), 1000),
                ],
            ),
            (
                660,
                vec![
                    ("unmatched|allowed".to_string(), 1),
                    ("route:search|allowed".to_string(), 2),
                ],
            ),
            (720, vec![("route:search|allowed".to_string(), 100)]),
        ];
        // two 1-minute bars from 600: the third hash is outside
        let t = summarize(600, Resolution::Minute1, 2, &hashes);
        let series = |e: &Endpoint| &t.endpoints.iter().find(|(x, _)| x == e).unwrap().1;
        let search = series(&Endpoint::Route("search".into()));
        assert_eq!(
            search.allowed,
            [5, 2],
            "the old-format field is not counted"
        );
        assert_eq!(search.throttled, [2, 0]);
        assert_eq!(search.shadow, [4, 0]);
        assert_eq!(search.degraded, [0, 0], "per-mode fields are not totals");
        assert_eq!(series(&Endpoint::Route("mode".into())).allowed, [3, 0]);
        assert_eq!(series(&Endpoint::Route("_".into())).allowed, [6, 0]);
        assert_eq!(series(&Endpoint::Unmatched).allowed, [0, 1]);
        assert_eq!(t.endpoints.last().unwrap().0, Endpoint::Unmatched);
        assert_eq!(t.p50_us, [Some(250), None]);
        assert_eq!(
            t.degraded_by_mode,
            [(floodgate_shared::policy::FailureMode::FailOpen, 9)]
        );
        assert_eq!(t.degraded_by_endpoint_mode[0].2, 9);
        assert_eq!((t.breaker_opened, t.breaker_open_ms), (1, 1500));
        assert_eq!(t.denied, [(floodgate_shared::deny::DenyList::Ip, 4)]);
        // six 10-second hashes summed into one 1-minute bar
        let tens: Vec<(i64, Vec<(String, u64)>)> = (0..6)
            .map(|i| (600 + 10 * i, vec![("unmatched|throttled".to_string(), 1)]))
            .collect();
        let t = summarize(600, Resolution::Minute1, 1, &tens);
        assert_eq!(t.endpoints[0].1.throttled, [6]);
    }

    #[test]
    fn bounded_policies_are_counted_through_the_stats_contract_with_the_edges_bound() {
        let config = |regions: u32| {
            EdgeConfig::from_json(&format!(
                r#"{{"regions":{regions},"policies":[
                {{"name":"search","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed","consistency":"bounded","max_overshoot":50}},
                {{"name":"burst","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed","consistency":"auto","max_overshoot":10}},
                {{"name":"default","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},"failure_mode":"fail_closed"}}],
                "plans":{{"free":["default"]}}}}"#
            ))
            .unwrap()
        };
        // without regions the whole bound is leased; with 2, the tallies' book
        // (the edge's LeaseSettings::leasable): search 50 - 10 x 2 x 50/40 =
        // 30; burst's bound is too small for credit, all of it is the book
        let rows = leasing_policies(&config(0));
        let shown: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.policy.as_str(), r.bound, r.leasable))
            .collect();
        assert_eq!(shown, [("burst", 10, 10), ("search", 50, 50)]);
        let mut rows = leasing_policies(&config(2));
        let shown: Vec<(&str, u64)> = rows
            .iter()
            .map(|r| (r.policy.as_str(), r.leasable))
            .collect();
        assert_eq!(shown, [("burst", 10), ("search", 30)]);
        let hashes = vec![
            vec![
                ("policy:search|local".to_string(), 90),
                ("policy:search|exact".to_string(), 10),
                ("policy:search|refills".to_string(), 4),
                ("policy:search|outstanding".to_string(), 40),
                ("policy:default|local".to_string(), 1000),
                ("route:search|allowed".to_string(), 100),
                ("policy:search|leased".to_string(), 7),
                ("search|local".to_string(), 7),
            ],
            vec![("policy:search|local".to_string(), 10)],
        ];
        count_leasing(&mut rows, &hashes);
        let s = &rows[1];
        assert_eq!(
            (s.local, s.exact, s.refills, s.outstanding),
            (100, 10, 4, 40)
        );
        assert_eq!((rows[0].local, rows[0].refills), (0, 0), "{rows:?}");
        assert!(leasing_policies(&EdgeConfig::from_json(crate_demo()).unwrap()).is_empty());
    }

    fn crate_demo() -> &'static str {
        r#"{"policies":[{"name":"default","dimensions":["api_key"],"quota":{"capacity":10,"period":"1m"},"failure_mode":"fail_closed"}],"plans":{"free":["default"]}}"#
    }

    #[test]
    fn keys_usage_and_the_most_throttled_come_from_the_key_hashes() {
        let hashes = vec![
            vec![
                ("K1|throttled".to_string(), 2),
                ("K2|throttled".to_string(), 3),
                ("K2|allowed".to_string(), 4),
            ],
            vec![
                ("K2|degraded".to_string(), 1),
                ("bad id|allowed".to_string(), 9),
            ],
        ];
        assert_eq!(
            key_usage(&hashes)["K2"],
            KeyUsage {
                allowed: 4,
                throttled: 3,
                degraded: 1
            }
        );
        assert_eq!(
            top_throttled(&hashes),
            [("K2".to_string(), 3), ("K1".to_string(), 2)]
        );
    }
}
