//! The typed contract between the edge (which writes traffic counters and the
//! decision sample to Redis) and the dashboard (which reads them): hash and list
//! names, every counter field, and the sample entry, each with `Display` (what the
//! edge writes) and `FromStr` (what the dashboard parses), checked by a round-trip
//! property test over every legal route name.
//!
//! Layout (`docs/failure.md` has the table and the memory bounds):
//! - `fg:stats:<unix minute>`: one field per edge instance, `@<instance>`, holding
//!   that instance's counts of the minute as one JSON [`MinuteCounts`] (its
//!   per-minute [`StatsField`]s, the per-10-second ones, its per-key
//!   [`KeyField`]s), rewritten whole by each flush: ONE command per flush,
//!   however many fields, and a lost flush is made good by the next. Kept
//!   [`MINUTE_TTL_SECS`]. Older edges wrote each counter as its own field
//!   (`HINCRBY`), and the per-10-second and per-key counts to `fg:stats10:<unix
//!   second / 10>` and `fg:keystats:<unix minute>`: [`Minute::read`] adds up both;
//! - `fg:key_last_used`: API key id → Unix seconds of its latest decision;
//! - `fg:sample`: the newest [`SampleEntry`]s, newest first: at least
//!   [`SAMPLE_KEEP`] once that many were sampled, trimmed back to it when it
//!   reaches [`SAMPLE_TRIM_AT`]; readers take the first `SAMPLE_KEEP`.
//!
//! An instance writes all three in ONE call of [`STATS_FLUSH`] per flush.
//!
//! Route names are `[a-z0-9_-]{1,32}`: every field puts a route name after
//! `route:` and ends it at `|`, two characters no route name contains, so a route
//! called `mode`, `lat`, `key` or `_` is counted as itself, and unmatched traffic
//! (`unmatched`) is never confused with a route.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::deny::DenyList;
use crate::policy::FailureMode;

mod flush;
pub use flush::{MinuteWrite, SAMPLE_CHUNK, SAMPLE_TRIM_AT, STATS_FLUSH, ScriptCall, StatsWrite};

/// How long the per-minute hashes stay (two days: the 24 h range and a margin).
pub const MINUTE_TTL_SECS: u64 = 2 * 86_400;
/// How long the per-10-second hashes stay (the 15 min and 1 h ranges at 10 s).
pub const TEN_SECOND_TTL_SECS: u64 = 2 * 3_600;
/// The list holding the most recent decisions (newest first), for backtests.
pub const SAMPLE_KEY: &str = "fg:sample";
/// How many decisions the sample keeps (all edges together).
pub const SAMPLE_KEEP: usize = 20_000;
/// API key id → Unix seconds of the key's latest decision (any edge).
pub const LAST_USED_KEY: &str = "fg:key_last_used";

/// The per-minute hash of `minute` (Unix minutes).
pub fn minute_key(minute: i64) -> String {
    format!("fg:stats:{minute}")
}

/// The per-10-second hash of `slot` (Unix seconds / 10).
pub fn ten_second_key(slot: i64) -> String {
    format!("fg:stats10:{slot}")
}

/// The per-minute hash of per-API-key counters of `minute`.
pub fn key_minute_key(minute: i64) -> String {
    format!("fg:keystats:{minute}")
}

/// A field or entry that does not follow the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a Floodgate stats field: {:?}", self.0)
    }
}

impl std::error::Error for ParseError {}

fn bad<T>(s: &str) -> Result<T, ParseError> {
    Err(ParseError(s.chars().take(80).collect()))
}

/// Where a request went: a configured route (by name) or no route at all.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    Route(String),
    /// The path matched no route.
    Unmatched,
}

impl Endpoint {
    /// The endpoint of a request that matched `route` (or none).
    pub fn of(route: Option<&str>) -> Self {
        route.map_or(Endpoint::Unmatched, |r| Endpoint::Route(r.to_string()))
    }

    /// The route's name, `None` for unmatched traffic.
    pub fn route(&self) -> Option<&str> {
        match self {
            Endpoint::Route(r) => Some(r),
            Endpoint::Unmatched => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        EndpointOf(self.route()).fmt(f)
    }
}

/// The text of the endpoint of a request that matched `route` (or none), from a
/// borrowed name: what [`Endpoint`] displays, without making one.
#[derive(Debug, Clone, Copy)]
pub struct EndpointOf<'a>(pub Option<&'a str>);

impl fmt::Display for EndpointOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

impl EndpointOf<'_> {
    /// The text, piece by piece (into a `String`: without the formatting machinery).
    pub fn write_to(&self, w: &mut impl fmt::Write) -> fmt::Result {
        match self.0 {
            Some(r) => {
                w.write_str("route:")?;
                w.write_str(r)
            }
            None => w.write_str("unmatched"),
        }
    }
}

impl FromStr for Endpoint {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.strip_prefix("route:") {
            Some(r) if crate::policy::validate_name("route", r).is_ok() => {
                Ok(Endpoint::Route(r.to_string()))
            }
            Some(_) => bad(s),
            None if s == "unmatched" => Ok(Endpoint::Unmatched),
            None => bad(s),
        }
    }
}

/// As its text (`route:<name>`, `unmatched`), so it can key a JSON map.
impl serde::Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Endpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What the edge answered one request.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Admitted by Redis (forwarded upstream).
    Allowed,
    /// Answered 429 (by Redis, the recent 429s answered locally, or the in-flight limit).
    Throttled,
    /// Decided without Redis, by the policies' failure mode.
    Degraded,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Allowed, Outcome::Throttled, Outcome::Degraded];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Throttled => "throttled",
            Outcome::Degraded => "degraded",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        Outcome::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// What a counter counts per endpoint or per key: an [`Outcome`], or an admitted
/// request a shadow policy would have throttled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Counted {
    Outcome(Outcome),
    ShadowThrottled,
}

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Counted {
    pub fn name(self) -> &'static str {
        match self {
            Counted::Outcome(o) => o.name(),
            Counted::ShadowThrottled => "shadow_throttled",
        }
    }
}

impl FromStr for Counted {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match Outcome::from_name(s) {
            Some(o) => Ok(Counted::Outcome(o)),
            None if s == "shadow_throttled" => Ok(Counted::ShadowThrottled),
            None => bad(s),
        }
    }
}

fn mode_from_name(s: &str) -> Option<FailureMode> {
    [
        FailureMode::FailOpen,
        FailureMode::FailClosed,
        FailureMode::LocalFallback,
    ]
    .into_iter()
    .find(|m| m.name() == s)
}

/// Store-call latency histogram bucket upper bounds (µs); the last is "above 1 s".
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

/// The histogram bucket (its upper bound, µs) holding a latency of `us`.
pub fn latency_bound(us: u64) -> u64 {
    LATENCY_BOUNDS_US[latency_index(us)]
}

/// The place in [`LATENCY_BOUNDS_US`] of the bucket holding a latency of `us`.
pub fn latency_index(us: u64) -> usize {
    // the last bound is u64::MAX: every latency has a bucket
    LATENCY_BOUNDS_US.partition_point(|b| *b < us)
}

/// One counter of a per-minute or per-10-second hash.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatsField {
    /// `route:<name>|<counted>` or `unmatched|<counted>`.
    Endpoint(Endpoint, Counted),
    /// `<endpoint>|degraded:<mode>`: degraded decisions by failure mode (they sum
    /// to the endpoint's `degraded`).
    EndpointMode(Endpoint, FailureMode),
    /// `mode:<mode>`: degraded decisions of every endpoint by failure mode.
    Mode(FailureMode),
    /// `lat:<upper bound µs>` (`lat:inf` above 1 s): store calls by latency.
    Latency(u64),
    /// `lat:sum_us`: the store calls' latencies summed (µs; with the `Latency`
    /// buckets, a Prometheus histogram's sum).
    LatencySumUs,
    /// `breaker:opened`: closed → open transitions of the circuit breaker.
    BreakerOpened,
    /// `breaker:open_ms`: ms the breaker spent open or half-open.
    BreakerOpenMs,
    /// `sample:dropped`: decisions an edge could not add to the sample (its
    /// queue between two flushes was full).
    SampleDropped,
    /// `policy:<name>|<leasing>`: how a bounded or `auto` policy's requests were
    /// decided, and what its leases cost (docs/consistency.md).
    Leasing(String, Leasing),
    /// `denied:<list>`: requests refused by a deny list (`key_id`, `ip`, `country`,
    /// `user_agent`).
    Denied(DenyList),
    /// `policy:<name>|<endpoint>|<outcome>`: a request's decision as one of its
    /// policies saw it (see [`PolicyOutcome`]): which policy throttled, on which
    /// route.
    PolicyDecision(String, Endpoint, PolicyOutcome),
}

/// A request's decision counted under one of its policies: every policy of an
/// admitted request counts `allowed` (a shadow policy that would have denied,
/// `shadow_throttled`); a throttled request counts under each policy that denied
/// it (its other policies spent nothing and count nothing); a request decided
/// without the store counts under each of its policies with the failure mode
/// applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyOutcome {
    Allowed,
    Throttled,
    ShadowThrottled,
    Degraded(FailureMode),
}

impl PolicyOutcome {
    pub const ALL: [PolicyOutcome; 6] = [
        PolicyOutcome::Allowed,
        PolicyOutcome::Throttled,
        PolicyOutcome::ShadowThrottled,
        PolicyOutcome::Degraded(FailureMode::FailOpen),
        PolicyOutcome::Degraded(FailureMode::FailClosed),
        PolicyOutcome::Degraded(FailureMode::LocalFallback),
    ];

    /// `allowed`, `throttled`, `shadow_throttled`, `degraded_<mode>`.
    pub fn name(self) -> &'static str {
        match self {
            PolicyOutcome::Allowed => "allowed",
            PolicyOutcome::Throttled => "throttled",
            PolicyOutcome::ShadowThrottled => "shadow_throttled",
            PolicyOutcome::Degraded(FailureMode::FailOpen) => "degraded_fail_open",
            PolicyOutcome::Degraded(FailureMode::FailClosed) => "degraded_fail_closed",
            PolicyOutcome::Degraded(FailureMode::LocalFallback) => "degraded_local_fallback",
        }
    }
}

/// What a bounded or `auto` policy's counters count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Leasing {
    /// Requests decided from tokens at hand (leases or the region's pool), without
    /// a round trip to the global store.
    Local,
    /// Requests decided on the exact path: tokens not at hand, an `auto` key not
    /// hot, or an exact policy on the same request.
    Exact,
    /// Calls to the global store that refilled a lease or a regional pool.
    Refills,
    /// Tokens outstanding on the policy's leases, as each refill found them (summed:
    /// ÷ `Refills` is the mean; against the bound, the share of it in use).
    Outstanding,
}

impl Leasing {
    pub const ALL: [Leasing; 4] = [
        Leasing::Local,
        Leasing::Exact,
        Leasing::Refills,
        Leasing::Outstanding,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Leasing::Local => "local",
            Leasing::Exact => "exact",
            Leasing::Refills => "refills",
            Leasing::Outstanding => "outstanding",
        }
    }
}

impl StatsField {
    /// Whether the field is also kept per 10 seconds (endpoint outcomes and latency;
    /// the rest only per minute).
    pub fn is_fine(&self) -> bool {
        matches!(self, StatsField::Endpoint(..) | StatsField::Latency(_))
    }

    /// The field's name, piece by piece: into a `String`, without the formatting
    /// machinery (the edge names a few fields per request).
    pub fn write_to(&self, w: &mut impl fmt::Write) -> fmt::Result {
        let endpoint = |w: &mut _, e: &Endpoint| EndpointOf(e.route()).write_to(w);
        match self {
            StatsField::Endpoint(e, c) => {
                endpoint(w, e)?;
                w.write_str("|")?;
                w.write_str(c.name())
            }
            StatsField::EndpointMode(e, m) => {
                endpoint(w, e)?;
                w.write_str("|degraded:")?;
                w.write_str(m.name())
            }
            StatsField::Mode(m) => {
                w.write_str("mode:")?;
                w.write_str(m.name())
            }
            StatsField::Latency(u64::MAX) => w.write_str("lat:inf"),
            StatsField::LatencySumUs => w.write_str("lat:sum_us"),
            StatsField::Latency(b) => write!(w, "lat:{b}"),
            StatsField::BreakerOpened => w.write_str("breaker:opened"),
            StatsField::BreakerOpenMs => w.write_str("breaker:open_ms"),
            StatsField::SampleDropped => w.write_str("sample:dropped"),
            StatsField::Leasing(policy, l) => {
                w.write_str("policy:")?;
                w.write_str(policy)?;
                w.write_str("|")?;
                w.write_str(l.name())
            }
            StatsField::Denied(list) => write!(w, "denied:{list}"),
            StatsField::PolicyDecision(policy, e, o) => {
                w.write_str("policy:")?;
                w.write_str(policy)?;
                w.write_str("|")?;
                endpoint(w, e)?;
                w.write_str("|")?;
                w.write_str(o.name())
            }
        }
    }
}

impl fmt::Display for StatsField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

impl FromStr for StatsField {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if let Some((policy, what)) = s
            .strip_prefix("policy:")
            .and_then(|rest| rest.split_once('|'))
        {
            if crate::policy::validate_name("policy", policy).is_err() {
                return bad(s);
            }
            if let Some((endpoint, outcome)) = what.split_once('|') {
                let outcome = PolicyOutcome::ALL.into_iter().find(|o| o.name() == outcome);
                return match outcome {
                    Some(o) => Ok(StatsField::PolicyDecision(
                        policy.to_string(),
                        endpoint.parse()?,
                        o,
                    )),
                    None => bad(s),
                };
            }
            let leasing = Leasing::ALL.into_iter().find(|l| l.name() == what);
            return match leasing {
                Some(l) => Ok(StatsField::Leasing(policy.to_string(), l)),
                None => bad(s),
            };
        }
        if let Some((endpoint, what)) = s.split_once('|') {
            let endpoint: Endpoint = endpoint.parse()?;
            return match what.strip_prefix("degraded:") {
                Some(mode) => mode_from_name(mode)
                    .map(|m| StatsField::EndpointMode(endpoint, m))
                    .map_or_else(|| bad(s), Ok),
                None => Ok(StatsField::Endpoint(endpoint, what.parse()?)),
            };
        }
        match s.split_once(':') {
            Some(("mode", m)) => mode_from_name(m).map(StatsField::Mode),
            Some(("lat", "inf")) => Some(StatsField::Latency(u64::MAX)),
            Some(("lat", "sum_us")) => Some(StatsField::LatencySumUs),
            Some(("lat", b)) => b
                .parse()
                .ok()
                .filter(|b| LATENCY_BOUNDS_US.contains(b))
                .map(StatsField::Latency),
            Some(("breaker", "opened")) => Some(StatsField::BreakerOpened),
            Some(("breaker", "open_ms")) => Some(StatsField::BreakerOpenMs),
            Some(("sample", "dropped")) => Some(StatsField::SampleDropped),
            Some(("denied", list)) => list.parse().ok().map(StatsField::Denied),
            _ => None,
        }
        .map_or_else(|| bad(s), Ok)
    }
}

/// One counter of a per-API-key hash: `<key id>|<counted>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyField {
    pub key_id: String,
    pub counted: Counted,
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        KeyField::write_of(f, &self.key_id, self.counted)
    }
}

impl KeyField {
    /// The field's text from a borrowed key id, piece by piece (into a `String`:
    /// without making a `KeyField` or using the formatting machinery).
    pub fn write_of(w: &mut impl fmt::Write, key_id: &str, counted: Counted) -> fmt::Result {
        w.write_str(key_id)?;
        w.write_str("|")?;
        w.write_str(counted.name())
    }
}

impl FromStr for KeyField {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let Some((id, counted)) = s.split_once('|') else {
            return bad(s);
        };
        if crate::keys::validate_key_id(id).is_err() {
            return bad(s);
        }
        Ok(KeyField {
            key_id: id.to_string(),
            counted: counted.parse()?,
        })
    }
}

/// One decision of the edge's sample: when, which key on which plan, where, and
/// what the edge answered: `<ms>|<key id>|<plan>|<endpoint>|<outcome>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleEntry {
    /// Unix milliseconds of the decision.
    pub at_ms: i64,
    pub key_id: String,
    pub plan: String,
    pub endpoint: Endpoint,
    pub outcome: Outcome,
}

impl fmt::Display for SampleEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        SampleLine {
            at_ms: self.at_ms,
            key_id: &self.key_id,
            plan: &self.plan,
            endpoint: EndpointOf(self.endpoint.route()),
            outcome: self.outcome,
        }
        .fmt(f)
    }
}

/// A [`SampleEntry`]'s text from borrowed parts (the edge writes one per
/// decision), without making one.
#[derive(Debug, Clone, Copy)]
pub struct SampleLine<'a> {
    pub at_ms: i64,
    pub key_id: &'a str,
    pub plan: &'a str,
    pub endpoint: EndpointOf<'a>,
    pub outcome: Outcome,
}

impl fmt::Display for SampleLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

impl SampleLine<'_> {
    /// The line, piece by piece (into a `String`: without the formatting machinery).
    pub fn write_to(&self, w: &mut impl fmt::Write) -> fmt::Result {
        write!(w, "{}", self.at_ms)?;
        for part in [self.key_id, self.plan] {
            w.write_str("|")?;
            w.write_str(part)?;
        }
        w.write_str("|")?;
        self.endpoint.write_to(w)?;
        w.write_str("|")?;
        w.write_str(self.outcome.name())
    }
}

impl FromStr for SampleEntry {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let parts: Vec<&str> = s.split('|').collect();
        let [at, key_id, plan, endpoint, outcome] = parts.as_slice() else {
            return bad(s);
        };
        let (Ok(at_ms), Some(outcome)) = (at.parse(), Outcome::from_name(outcome)) else {
            return bad(s);
        };
        if crate::keys::validate_key_id(key_id).is_err()
            || crate::policy::validate_name("plan", plan).is_err()
        {
            return bad(s);
        }
        Ok(SampleEntry {
            at_ms,
            key_id: key_id.to_string(),
            plan: plan.to_string(),
            endpoint: endpoint.parse()?,
            outcome,
        })
    }
}

/// The field of `fg:stats:<minute>` holding one instance's counts of the minute.
pub fn instance_field(instance: &str) -> String {
    format!("@{instance}")
}

/// One instance's counts of one minute: what it writes as one field of the
/// minute's hash, as JSON. Field names are the texts of [`StatsField`] and
/// [`KeyField`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MinuteCounts {
    /// Per-minute fields.
    #[serde(default, rename = "m", skip_serializing_if = "BTreeMap::is_empty")]
    pub minute: BTreeMap<String, u64>,
    /// Per 10-second slot (Unix seconds / 10): the fine fields.
    #[serde(default, rename = "t", skip_serializing_if = "BTreeMap::is_empty")]
    pub tens: BTreeMap<i64, BTreeMap<String, u64>>,
    /// Per API key.
    #[serde(default, rename = "k", skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, u64>,
}

impl MinuteCounts {
    pub fn is_empty(&self) -> bool {
        self.minute.is_empty() && self.tens.is_empty() && self.keys.is_empty()
    }

    /// How many counters it holds.
    pub fn len(&self) -> usize {
        self.minute.len() + self.keys.len() + self.tens.values().map(BTreeMap::len).sum::<usize>()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    fn add_all(&mut self, other: &MinuteCounts) {
        let add = |into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>| {
            for (k, n) in from {
                *into.entry(k.clone()).or_default() += n;
            }
        };
        add(&mut self.minute, &other.minute);
        add(&mut self.keys, &other.keys);
        for (slot, fields) in &other.tens {
            add(self.tens.entry(*slot).or_default(), fields);
        }
    }
}

/// A minute read back: every instance's counts added up, with what older edges
/// wrote as separate counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Minute(pub MinuteCounts);

impl Minute {
    /// The minute from the fields of its `fg:stats:<minute>` hash: instance fields
    /// ([`instance_field`]) hold JSON counts, any other field is an older edge's
    /// counter; what parses as neither is skipped.
    pub fn read(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Self {
        let mut out = MinuteCounts::default();
        for (k, v) in pairs {
            if k.first() == Some(&b'@') {
                if let Ok(counts) = serde_json::from_slice::<MinuteCounts>(&v) {
                    out.add_all(&counts);
                }
            } else if let Some(n) = std::str::from_utf8(&v)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
            {
                *out.minute
                    .entry(String::from_utf8_lossy(&k).into_owned())
                    .or_default() += n;
            }
        }
        Minute(out)
    }

    /// Adds an older edge's per-key counters of this minute
    /// (`fg:keystats:<minute>`).
    pub fn add_legacy_keys(&mut self, pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) {
        for (k, v) in pairs {
            let Some(n) = std::str::from_utf8(&v)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            let field = String::from_utf8_lossy(&k).into_owned();
            *self.0.keys.entry(field).or_default() += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn endpoint() -> impl Strategy<Value = Endpoint> {
        prop_oneof![
            Just(Endpoint::Unmatched),
            // every legal route name, the troublesome ones made likely
            prop_oneof![
                "[a-z0-9_-]{1,32}",
                Just("_".to_string()),
                Just("mode".to_string()),
                Just("lat".to_string()),
                Just("key".to_string()),
                Just("breaker".to_string()),
                Just("sample".to_string()),
                Just("unmatched".to_string()),
                Just("route".to_string()),
            ]
            .prop_map(Endpoint::Route),
        ]
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop::sample::select(Outcome::ALL.to_vec())
    }

    fn counted() -> impl Strategy<Value = Counted> {
        prop_oneof![
            outcome().prop_map(Counted::Outcome),
            Just(Counted::ShadowThrottled)
        ]
    }

    fn mode() -> impl Strategy<Value = FailureMode> {
        prop::sample::select(vec![
            FailureMode::FailOpen,
            FailureMode::FailClosed,
            FailureMode::LocalFallback,
        ])
    }

    fn field() -> impl Strategy<Value = StatsField> {
        prop_oneof![
            (endpoint(), counted()).prop_map(|(e, c)| StatsField::Endpoint(e, c)),
            (endpoint(), mode()).prop_map(|(e, m)| StatsField::EndpointMode(e, m)),
            mode().prop_map(StatsField::Mode),
            prop::sample::select(LATENCY_BOUNDS_US.to_vec()).prop_map(StatsField::Latency),
            Just(StatsField::LatencySumUs),
            Just(StatsField::BreakerOpened),
            Just(StatsField::BreakerOpenMs),
            Just(StatsField::SampleDropped),
            (
                prop_oneof![
                    "[a-z0-9_-]{1,32}",
                    Just("route".to_string()),
                    Just("mode".to_string())
                ],
                prop::sample::select(Leasing::ALL.to_vec())
            )
                .prop_map(|(p, l)| StatsField::Leasing(p, l)),
            prop::sample::select(DenyList::ALL.to_vec()).prop_map(StatsField::Denied),
            (
                prop_oneof![
                    "[a-z0-9_-]{1,32}",
                    Just("route".to_string()),
                    Just("unmatched".to_string())
                ],
                endpoint(),
                prop::sample::select(PolicyOutcome::ALL.to_vec())
            )
                .prop_map(|(p, e, o)| StatsField::PolicyDecision(p, e, o)),
        ]
    }

    proptest! {
        #[test]
        fn every_stats_field_parses_back_to_itself(f in field()) {
            let text = f.to_string();
            prop_assert_eq!(text.parse::<StatsField>(), Ok(f));
        }

        #[test]
        fn every_key_field_parses_back_to_itself(id in "[A-Za-z0-9_-]{1,32}", c in counted()) {
            let f = KeyField { key_id: id, counted: c };
            prop_assert_eq!(f.to_string().parse::<KeyField>(), Ok(f));
        }

        #[test]
        fn every_sample_entry_parses_back_to_itself(
            at_ms in 0i64..4_000_000_000_000,
            key_id in "[A-Za-z0-9_-]{1,32}",
            plan in "[a-z0-9_-]{1,32}",
            endpoint in endpoint(),
            outcome in outcome(),
        ) {
            let e = SampleEntry { at_ms, key_id, plan, endpoint, outcome };
            prop_assert_eq!(e.to_string().parse::<SampleEntry>(), Ok(e));
        }

        #[test]
        fn no_two_fields_share_a_text(a in field(), b in field()) {
            prop_assert_eq!(a == b, a.to_string() == b.to_string());
        }
    }

    #[test]
    fn routes_named_like_the_other_fields_count_as_routes() {
        for name in ["mode", "lat", "key", "_", "breaker", "unmatched"] {
            let f = StatsField::Endpoint(
                Endpoint::Route(name.into()),
                Counted::Outcome(Outcome::Allowed),
            );
            assert_eq!(f.to_string(), format!("route:{name}|allowed"));
            assert_eq!(f.to_string().parse(), Ok(f));
        }
        assert_eq!(
            "unmatched|throttled".parse(),
            Ok(StatsField::Endpoint(
                Endpoint::Unmatched,
                Counted::Outcome(Outcome::Throttled)
            ))
        );
        assert_eq!(
            "mode:fail_open".parse(),
            Ok(StatsField::Mode(FailureMode::FailOpen))
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "_|allowed",
            "search|allowed",
            "route:|allowed",
            "route:Search|allowed",
            "route:a b|allowed",
            "route:x|maybe",
            "route:x|degraded:sometimes",
            "mode:maybe",
            "lat:7",
            "lat:",
            "breaker:closed",
            "key|K1|allowed",
            "policy:|local",
            "policy:Search|local",
            "policy:search|leased",
            "policy:search",
            "policy:a b|local",
            "policy:search|route:search|maybe",
            "policy:search|route:Search|allowed",
            "policy:search|somewhere|allowed",
            "policy:search|unmatched|degraded",
            "policy:search|unmatched|allowed|x",
            "policy:Search|unmatched|allowed",
            "denied:",
            "denied:keys",
            "denied:IP",
        ] {
            assert!(bad.parse::<StatsField>().is_err(), "{bad}");
        }
        for bad in ["", "K1", "K 1|allowed", "K1|nope", "K1|allowed|x"] {
            assert!(bad.parse::<KeyField>().is_err(), "{bad}");
        }
        for bad in [
            "",
            "x|Ab3dE5gH1j|free|unmatched|allowed",
            "1|bad id|free|unmatched|allowed",
            "1|Ab3dE5gH1j|Free|unmatched|allowed",
            "1|Ab3dE5gH1j|free|route:<b>|allowed",
            "1|Ab3dE5gH1j|free|_",
            "1|Ab3dE5gH1j|free|unmatched",
            "1|Ab3dE5gH1j|free|unmatched|allowed|x",
            "1|Ab3dE5gH1j|free|unmatched|shadow_throttled",
        ] {
            assert!(bad.parse::<SampleEntry>().is_err(), "{bad}");
        }
    }

    #[test]
    fn latencies_fall_in_their_histogram_bucket() {
        assert_eq!(latency_bound(0), 250);
        assert_eq!(latency_bound(250), 250);
        assert_eq!(latency_bound(251), 500);
        assert_eq!(latency_bound(20_000_000), u64::MAX);
        assert_eq!(latency_bound(u64::MAX), u64::MAX);
        assert_eq!(latency_index(251), 1);
    }

    #[test]
    fn a_minute_adds_up_every_instance_and_the_older_counters() {
        let one = MinuteCounts {
            minute: [("unmatched|allowed".to_string(), 3)].into(),
            tens: [(5, [("unmatched|allowed".to_string(), 2)].into())].into(),
            keys: [("k1|allowed".to_string(), 3)].into(),
        };
        let two = MinuteCounts {
            minute: [("unmatched|allowed".to_string(), 4)].into(),
            ..MinuteCounts::default()
        };
        let pairs = vec![
            (instance_field("a").into_bytes(), one.to_json().into_bytes()),
            (instance_field("b").into_bytes(), two.to_json().into_bytes()),
            (b"unmatched|allowed".to_vec(), b"10".to_vec()),
            (b"@broken".to_vec(), b"{".to_vec()),
            (b"junk".to_vec(), b"x".to_vec()),
        ];
        let mut m = Minute::read(pairs);
        m.add_legacy_keys(vec![(b"k1|allowed".to_vec(), b"1".to_vec())]);
        assert_eq!(m.0.minute["unmatched|allowed"], 17);
        assert_eq!(m.0.keys["k1|allowed"], 4);
        assert_eq!(m.0.tens[&5]["unmatched|allowed"], 2);
        assert!(!m.0.minute.contains_key("junk"));
    }

    proptest! {
        #[test]
        fn minute_counts_round_trip(
            minute in proptest::collection::btree_map("[a-z:|_]{1,20}", 0u64..1_000_000, 0..8),
            keys in proptest::collection::btree_map("[A-Za-z0-9]{10}\\|allowed", 0u64..1000, 0..8),
            slot in 0i64..1_000_000_000,
        ) {
            let c = MinuteCounts { tens: [(slot, minute.clone())].into(), minute, keys };
            let back: MinuteCounts = serde_json::from_str(&c.to_json()).unwrap();
            prop_assert_eq!(back, c);
        }
    }
}
