//! Policy types: what is limited (dimensions), how much (quota), what one request
//! costs and what happens when Redis cannot answer (failure mode).
//!
//! Operators write [`PolicySpec`] (JSON); [`Policy`] is the validated form the edge
//! enforces. The dashboard and the edge run the same validation, so a policy one
//! accepts is exactly a policy the other enforces. Every error names its field.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::calendar::{CalendarPeriod, DAY};
use crate::time::{MICROS_PER_MS, MICROS_PER_SEC, Micros};

/// The largest capacity (burst) and refill amount a quota may state.
pub const MAX_CAPACITY: u64 = 1_000_000_000;
/// The longest time an empty bucket may take to fill (capacity × refill interval):
/// 400 days, enough for monthly and yearly plans. It bounds every stored value.
pub const MAX_WINDOW: Micros = 400 * 86_400 * MICROS_PER_SEC;
/// The longest period a quota may state.
pub const MAX_PERIOD: Micros = 366 * 86_400 * MICROS_PER_SEC;
/// Names of policies, routes and API key ids: `[a-z0-9_-]`, this long at most.
pub const MAX_NAME_LEN: usize = 32;
/// The largest policy document `Policy::from_json` reads.
pub const MAX_POLICY_JSON: usize = 16 * 1024;

/// A validation error that names the offending field (`quota.capacity`, `name`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl PolicyError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A quota: `capacity` tokens of burst, refilled continuously at `refill` tokens per
/// `period`. 1,000 requests/minute is `{capacity: 1000, refill: 1000, period: "1m"}`.
///
/// Internally a quota is two integers: the emission interval `T` (µs per token,
/// `period / refill` rounded UP so rounding can never admit more than stated) and
/// the burst window `B = capacity × T` (µs an empty bucket takes to fill).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    capacity: u64,
    refill: u64,
    period: Micros,
    emission: Micros,
    burst: Micros,
    algorithm: Algorithm,
    /// A calendar quota (`period: "day"` or `"month"`): `capacity` per UTC day
    /// or month, counted in the calendar window ([`crate::calendar`]).
    calendar: Option<CalendarPeriod>,
}

/// How a policy measures its quota (see `shared/src/windows.rs`, `docs/algorithms.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// `capacity` of burst refilled continuously at `refill` per `period` (GCRA).
    #[default]
    TokenBucket,
    /// At most `capacity` per aligned `period` (allows 2× at a window edge).
    FixedWindow,
    /// At most `capacity` in any `period` (exact; one entry per token).
    SlidingLog,
    /// The previous window weighted by its overlap plus the current one (approximate).
    SlidingCounter,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingCounter => "sliding_counter",
        }
    }

    fn is_default(&self) -> bool {
        *self == Algorithm::TokenBucket
    }
}

impl Quota {
    /// Validates and builds a quota. `period` is in microseconds.
    pub fn new(capacity: u64, refill: u64, period: Micros) -> Result<Self, PolicyError> {
        if !(1..=MAX_CAPACITY).contains(&capacity) {
            return Err(PolicyError::new(
                "quota.capacity",
                format!("must be between 1 and {MAX_CAPACITY}, got {capacity}"),
            ));
        }
        if !(1..=MAX_CAPACITY).contains(&refill) {
            return Err(PolicyError::new(
                "quota.refill",
                format!("must be between 1 and {MAX_CAPACITY}, got {refill}"),
            ));
        }
        if !(MICROS_PER_MS..=MAX_PERIOD).contains(&period) {
            return Err(PolicyError::new(
                "quota.period",
                format!("must be between 1ms and 366d, got {}", Period(period)),
            ));
        }
        // refill ≤ 1e9 and period ≤ 366d keep every product below i64::MAX.
        let refill_i = i64::try_from(refill).expect("refill ≤ 1e9");
        if refill_i > period {
            return Err(PolicyError::new(
                "quota.refill",
                format!(
                    "refilling {refill} tokens per {} is faster than one token per microsecond",
                    Period(period)
                ),
            ));
        }
        let emission = (period + refill_i - 1) / refill_i;
        let burst = i64::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_mul(emission))
            .filter(|b| *b <= MAX_WINDOW)
            .ok_or_else(|| {
                PolicyError::new(
                    "quota.capacity",
                    format!(
                        "an empty bucket of {capacity} tokens refilling {refill} per {} would take \
                         longer than 400d to fill",
                        Period(period)
                    ),
                )
            })?;
        Ok(Self {
            capacity,
            refill,
            period,
            emission,
            burst,
            algorithm: Algorithm::TokenBucket,
            calendar: None,
        })
    }

    /// A calendar quota: at most `capacity` per UTC `period` (a day, or a month
    /// from its 1st), reset at 00:00 UTC. It is a fixed window whose windows are
    /// the calendar's ([`Quota::calendar`]); [`Quota::period`] is the longest
    /// such window (1 day, or 31 days), what a local fallback's share refills
    /// over.
    pub fn calendar_quota(capacity: u64, period: CalendarPeriod) -> Result<Self, PolicyError> {
        let longest = match period {
            CalendarPeriod::Day => DAY,
            CalendarPeriod::Month => 31 * DAY,
        };
        let mut q =
            Self::new(capacity, capacity, longest)?.with_algorithm(Algorithm::FixedWindow)?;
        q.calendar = Some(period);
        Ok(q)
    }

    /// The calendar period of a calendar quota; `None` for every other quota.
    pub fn calendar(&self) -> Option<CalendarPeriod> {
        self.calendar
    }

    /// The same quota enforced by `algorithm`. Window algorithms admit `capacity`
    /// per `period`: their refill must equal the capacity, and a sliding log holds at
    /// most [`crate::windows::MAX_LOG_LIMIT`].
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Result<Self, PolicyError> {
        if algorithm != Algorithm::TokenBucket && self.refill != self.capacity {
            return Err(PolicyError::new(
                "quota.refill",
                format!(
                    "{} admits quota.capacity per period; a different refill ({}) does not apply",
                    algorithm.name(),
                    self.refill
                ),
            ));
        }
        if algorithm == Algorithm::SlidingLog && self.capacity > crate::windows::MAX_LOG_LIMIT {
            return Err(PolicyError::new(
                "quota.capacity",
                format!(
                    "a sliding_log keeps one entry per token: at most {} per period, got {}",
                    crate::windows::MAX_LOG_LIMIT,
                    self.capacity
                ),
            ));
        }
        self.algorithm = algorithm;
        Ok(self)
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Parses the short form `<limit>/<period>` (`1000/1m`: capacity and refill 1000
    /// per minute), as command lines take it.
    pub fn parse_short(text: &str) -> Result<Self, PolicyError> {
        let (limit, period) = text.split_once('/').ok_or_else(|| {
            PolicyError::new(
                "quota",
                format!(
                    "expected <limit>/<period> like 1000/1m, got {:?}",
                    truncate(text, 40)
                ),
            )
        })?;
        let limit: u64 = limit.parse().map_err(|_| {
            PolicyError::new(
                "quota.capacity",
                format!("expected a whole number, got {:?}", truncate(limit, 40)),
            )
        })?;
        let period = Period::parse(period).map_err(|m| PolicyError::new("quota.period", m))?;
        Self::new(limit, limit, period.0)
    }

    /// Tokens per `period` over `period`, e.g. `per_minute(1000)`.
    pub fn per_minute(limit: u64) -> Result<Self, PolicyError> {
        Self::new(limit, limit, 60 * MICROS_PER_SEC)
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn refill(&self) -> u64 {
        self.refill
    }
    pub fn period(&self) -> Micros {
        self.period
    }
    /// µs per token (`T`).
    pub fn emission_interval(&self) -> Micros {
        self.emission
    }
    /// µs an empty bucket takes to fill (`B = capacity × T`).
    pub fn burst_window(&self) -> Micros {
        self.burst
    }
    /// `cost × T`, saturated just above [`MAX_WINDOW`]: any larger cost can never be
    /// admitted anyway, and the saturated value keeps all arithmetic below 2^53.
    pub fn cost_window(&self, cost: u32) -> Micros {
        i64::from(cost)
            .saturating_mul(self.emission)
            .min(MAX_WINDOW + 1)
    }
}

/// A duration written with one unit: `500ms`, `60s`, `1m`, `1h`, `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period(pub Micros);

const UNITS: [(&str, Micros); 5] = [
    ("d", 86_400 * MICROS_PER_SEC),
    ("h", 3_600 * MICROS_PER_SEC),
    ("m", 60 * MICROS_PER_SEC),
    ("s", MICROS_PER_SEC),
    ("ms", MICROS_PER_MS),
];

impl Period {
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = || {
            format!(
                "expected a duration like \"500ms\", \"60s\", \"1m\", \"1h\" or \"1d\", got {:?}",
                truncate(text, 40)
            )
        };
        let digits = text.bytes().take_while(u8::is_ascii_digit).count();
        let (number, unit) = text.split_at(digits);
        let scale = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, s)| *s)
            .ok_or_else(expected)?;
        if number.is_empty() || number.len() > 18 {
            return Err(expected());
        }
        let n: i64 = number.parse().map_err(|_| expected())?;
        n.checked_mul(scale)
            .map(Period)
            .ok_or_else(|| "is too long".to_string())
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, scale) in UNITS {
            if self.0 != 0 && self.0 % scale == 0 {
                return write!(f, "{}{unit}", self.0 / scale);
            }
        }
        write!(f, "{}us", self.0)
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// What a bucket is keyed by. A policy's bucket key includes exactly its dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The authenticated API key (its id, never its secret).
    ApiKey,
    /// The configured route the request matched (never the raw path).
    Endpoint,
    /// The client address (IPv6 grouped by /64).
    ClientIp,
    /// The API key's identity (the operator's customer): every key of one
    /// identity shares the bucket; a key without an identity has a bucket of its
    /// own, named by its id as with `api_key` (`shared/src/keys.rs`).
    Identity,
}

/// What the edge does when Redis cannot give a decision (see `docs/failure.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Admit the request (marked as degraded).
    FailOpen,
    /// Reject the request: it cannot be proven within quota.
    FailClosed,
    /// Decide with an in-memory bucket per edge instance holding
    /// `local_share_percent` of the quota (capacity and refill scaled).
    LocalFallback,
}

impl FailureMode {
    /// The mode applied when several policies match: fail_closed over
    /// local_fallback over fail_open (fail_open when none match).
    pub fn strictest(modes: impl IntoIterator<Item = FailureMode>) -> FailureMode {
        let rank = |m: &FailureMode| match m {
            FailureMode::FailOpen => 0,
            FailureMode::LocalFallback => 1,
            FailureMode::FailClosed => 2,
        };
        modes
            .into_iter()
            .max_by_key(rank)
            .unwrap_or(FailureMode::FailOpen)
    }

    /// The name used in JSON and in the counters (`mode:<name>`, see [`crate::stats`]).
    pub fn name(self) -> &'static str {
        match self {
            FailureMode::FailOpen => "fail_open",
            FailureMode::FailClosed => "fail_closed",
            FailureMode::LocalFallback => "local_fallback",
        }
    }
}

/// How closely a policy is enforced across edge instances and regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Every decision is one round trip to the global Redis: never above quota.
    #[default]
    Exact,
    /// Decided from tokens leased ahead (per instance, or per region with a
    /// regional store): no global round trip for a warm key; admissions of any
    /// window exceed the exact quota by at most `max_overshoot` tokens, a bound the
    /// global Redis enforces over every lease outstanding.
    Bounded,
    /// Exact until a key turns hot on an instance, bounded while it stays hot.
    Auto,
}

impl Consistency {
    pub fn name(self) -> &'static str {
        match self {
            Consistency::Exact => "exact",
            Consistency::Bounded => "bounded",
            Consistency::Auto => "auto",
        }
    }

    pub fn is_default(&self) -> bool {
        *self == Consistency::Exact
    }
}

/// The most requests in flight a policy may allow per bucket.
pub const MAX_IN_FLIGHT: u32 = 100_000;

/// A validated, enforceable policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: String,
    dimensions: Vec<Dimension>,
    quota: Quota,
    cost: u32,
    failure_mode: FailureMode,
    local_share_percent: Option<u8>,
    local_quota: Option<Quota>,
    max_in_flight: Option<u32>,
    shadow: bool,
    consistency: Consistency,
    max_overshoot: Option<u64>,
}

impl Policy {
    /// How closely the policy is enforced across instances ([`Consistency`]).
    pub fn consistency(&self) -> Consistency {
        self.consistency
    }
    /// With bounded or auto consistency: the most tokens admitted above the exact
    /// quota in any window, all instances and regions together.
    pub fn max_overshoot(&self) -> Option<u64> {
        self.max_overshoot
    }
    /// Shadow (dry-run) mode: computed and counted, never enforced.
    pub fn shadow(&self) -> bool {
        self.shadow
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The dimensions, sorted and without duplicates.
    pub fn dimensions(&self) -> &[Dimension] {
        &self.dimensions
    }
    pub fn has(&self, d: Dimension) -> bool {
        self.dimensions.contains(&d)
    }
    pub fn quota(&self) -> &Quota {
        &self.quota
    }
    pub fn cost(&self) -> u32 {
        self.cost
    }
    pub fn failure_mode(&self) -> FailureMode {
        self.failure_mode
    }
    /// With [`FailureMode::LocalFallback`]: the quota one edge instance enforces on
    /// its own while Redis is unavailable (capacity and refill scaled down to
    /// `local_share_percent`, at least 1 token each).
    pub fn local_quota(&self) -> Option<&Quota> {
        self.local_quota.as_ref()
    }
    /// The most requests in flight at once per bucket of this policy (per API key
    /// for a plan's policy); `None`: not limited.
    pub fn max_in_flight(&self) -> Option<u32> {
        self.max_in_flight
    }

    /// Parses and validates one policy document. Bounded in size; every error names
    /// the field (`quota.capacity: must be between ...`).
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let spec: PolicySpec = parse_json(text, MAX_POLICY_JSON)?;
        spec.validate()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&PolicySpec::from(self)).expect("a policy spec always serializes")
    }
}

/// Parses a bounded JSON document; type errors name their field path
/// (`quota.capacity: invalid type ...`), structural ones `(document)`.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    text: &str,
    max: usize,
) -> Result<T, PolicyError> {
    if text.len() > max {
        return Err(PolicyError::new(
            "(document)",
            format!("is {} bytes; at most {max} are accepted", text.len()),
        ));
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path == "?" {
            "(document)".to_string()
        } else {
            path
        };
        PolicyError::new(field, e.into_inner().to_string())
    })
}

/// The operator-facing form of a quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Burst: the most tokens a bucket holds.
    pub capacity: u64,
    /// Tokens added per `period`; defaults to `capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill: Option<u64>,
    /// `500ms`, `60s`, `1m`, `1h`, `1d` (rolling), or `day` / `month`: a
    /// calendar quota, reset at 00:00 UTC (a month on its 1st).
    pub period: String,
}

/// The operator-facing form of a policy, as written in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub name: String,
    pub dimensions: Vec<Dimension>,
    pub quota: QuotaSpec,
    /// Tokens one request takes; defaults to 1.
    #[serde(default = "one")]
    pub cost: u32,
    pub failure_mode: FailureMode,
    /// With `failure_mode: local_fallback` (and only then): the share of the quota,
    /// in percent (1-100), each edge instance enforces alone while Redis is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_share_percent: Option<u8>,
    /// The most requests of one bucket (e.g. one API key) in flight at once,
    /// next to the rate limit; absent: not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// How the quota is measured; defaults to `token_bucket`.
    #[serde(default, skip_serializing_if = "Algorithm::is_default")]
    pub algorithm: Algorithm,
    /// Shadow (dry-run) mode: decided and counted ("would have throttled"), never
    /// enforced; defaults to false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// `exact` (default), `bounded` or `auto` (see [`Consistency`]).
    #[serde(default, skip_serializing_if = "Consistency::is_default")]
    pub consistency: Consistency,
    /// With `bounded` or `auto` (and only then): the overshoot bound in tokens,
    /// 1 to `quota.capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_overshoot: Option<u64>,
}

fn one() -> u32 {
    1
}

/// Checks a name used inside Redis keys: policy names, route names, key ids.
pub fn validate_name(field: &str, name: &str) -> Result<(), PolicyError> {
    if name.is_empty() {
        return Err(PolicyError::new(field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(PolicyError::new(
            field,
            format!(
                "must be at most {MAX_NAME_LEN} characters, got {}",
                name.len()
            ),
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(PolicyError::new(
            field,
            format!(
                "may contain only a-z, 0-9, '_' and '-', got {:?}",
                truncate(name, 40)
            ),
        ));
    }
    Ok(())
}

impl PolicySpec {
    /// The dimensions, sorted: at least one, none twice, not both identity and
    /// api_key.
    fn checked_dimensions(&self) -> Result<Vec<Dimension>, PolicyError> {
        if self.dimensions.is_empty() {
            return Err(PolicyError::new(
                "dimensions",
                "must name at least one of api_key, identity, endpoint, client_ip",
            ));
        }
        let mut dimensions = self.dimensions.clone();
        dimensions.sort();
        dimensions.dedup();
        if dimensions.len() != self.dimensions.len() {
            return Err(PolicyError::new(
                "dimensions",
                "must not repeat a dimension",
            ));
        }
        if dimensions.contains(&Dimension::Identity) && dimensions.contains(&Dimension::ApiKey) {
            return Err(PolicyError::new(
                "dimensions",
                "names identity and api_key together: an identity's bucket is shared by \
                 its keys, a key's is its own; choose one",
            ));
        }
        Ok(dimensions)
    }

    /// The quota: rolling (`1m`, `1d`, ... with the policy's algorithm) or a
    /// calendar quota (`day`, `month`), which counts in calendar windows and so
    /// takes no `algorithm` and no other `refill` than its capacity.
    fn checked_quota(&self) -> Result<Quota, PolicyError> {
        let calendar = match self.quota.period.as_str() {
            "day" => Some(CalendarPeriod::Day),
            "month" => Some(CalendarPeriod::Month),
            _ => None,
        };
        let Some(period) = calendar else {
            let period = Period::parse(&self.quota.period)
                .map_err(|m| PolicyError::new("quota.period", m))?;
            return Quota::new(
                self.quota.capacity,
                self.quota.refill.unwrap_or(self.quota.capacity),
                period.0,
            )?
            .with_algorithm(self.algorithm);
        };
        if !self.algorithm.is_default() {
            return Err(PolicyError::new(
                "algorithm",
                format!(
                    "a calendar period ({:?}) counts in calendar windows; algorithm {:?} \
                     does not apply (leave it out)",
                    period.name(),
                    self.algorithm.name()
                ),
            ));
        }
        if let Some(r) = self.quota.refill.filter(|r| *r != self.quota.capacity) {
            return Err(PolicyError::new(
                "quota.refill",
                format!(
                    "a calendar period ({:?}) resets to quota.capacity; a different refill \
                     ({r}) does not apply",
                    period.name()
                ),
            ));
        }
        if self.consistency != Consistency::Exact {
            return Err(PolicyError::new(
                "consistency",
                format!(
                    "a calendar period ({:?}) is always decided exactly (use \"exact\")",
                    period.name()
                ),
            ));
        }
        Quota::calendar_quota(self.quota.capacity, period)
    }

    pub fn validate(&self) -> Result<Policy, PolicyError> {
        validate_name("name", &self.name)?;
        let dimensions = self.checked_dimensions()?;
        let quota = self.checked_quota()?;
        if self.cost == 0 || u64::from(self.cost) > quota.capacity() {
            return Err(PolicyError::new(
                "cost",
                format!(
                    "must be between 1 and quota.capacity ({}), got {}",
                    quota.capacity(),
                    self.cost
                ),
            ));
        }
        let local_quota = match (self.failure_mode, self.local_share_percent) {
            (FailureMode::LocalFallback, None) => {
                return Err(PolicyError::new(
                    "local_share_percent",
                    "is required with failure_mode \"local_fallback\": the percent (1-100) \
                     of the quota each instance enforces alone",
                ));
            }
            (FailureMode::LocalFallback, Some(pct)) => Some(local_quota(&quota, pct, self.cost)?),
            (_, Some(_)) => {
                return Err(PolicyError::new(
                    "local_share_percent",
                    format!(
                        "only applies to failure_mode \"local_fallback\", not {:?}",
                        self.failure_mode.name()
                    ),
                ));
            }
            (_, None) => None,
        };
        if let Some(n) = self.max_in_flight
            && !(1..=MAX_IN_FLIGHT).contains(&n)
        {
            return Err(PolicyError::new(
                "max_in_flight",
                format!("must be between 1 and {MAX_IN_FLIGHT}, got {n}"),
            ));
        }
        let max_overshoot = self.validate_consistency(&quota)?;
        Ok(Policy {
            name: self.name.clone(),
            dimensions,
            quota,
            cost: self.cost,
            failure_mode: self.failure_mode,
            local_share_percent: self.local_share_percent,
            local_quota,
            max_in_flight: self.max_in_flight,
            shadow: self.shadow,
            consistency: self.consistency,
            max_overshoot,
        })
    }

    /// `consistency` and `max_overshoot` together: the bound where one is needed.
    fn validate_consistency(&self, quota: &Quota) -> Result<Option<u64>, PolicyError> {
        match (self.consistency, self.max_overshoot) {
            (Consistency::Exact, None) => Ok(None),
            (Consistency::Exact, Some(_)) => Err(PolicyError::new(
                "max_overshoot",
                "only applies to consistency \"bounded\" or \"auto\"",
            )),
            (c, None) => Err(PolicyError::new(
                "max_overshoot",
                format!(
                    "is required with consistency {:?}: the most tokens (1 to quota.capacity) \
                     admitted above the quota in any window, all edges together",
                    c.name()
                ),
            )),
            (c, Some(n)) => {
                if quota.algorithm() != Algorithm::TokenBucket {
                    return Err(PolicyError::new(
                        "consistency",
                        format!(
                            "{:?} leases tokens from a token bucket; algorithm {:?} cannot lease \
                             (use \"exact\")",
                            c.name(),
                            quota.algorithm().name()
                        ),
                    ));
                }
                if self.shadow {
                    return Err(PolicyError::new(
                        "consistency",
                        "a shadow policy is always decided exactly",
                    ));
                }
                if self.max_in_flight.is_some() {
                    return Err(PolicyError::new(
                        "consistency",
                        "max_in_flight takes a slot in the global store on every request: \
                         use consistency \"exact\"",
                    ));
                }
                if !(1..=quota.capacity()).contains(&n) {
                    return Err(PolicyError::new(
                        "max_overshoot",
                        format!(
                            "must be between 1 and quota.capacity ({}), got {n}",
                            quota.capacity()
                        ),
                    ));
                }
                Ok(Some(n))
            }
        }
    }
}

/// `quota` scaled to `pct` percent (capacity and refill, at least 1 each).
fn local_quota(quota: &Quota, pct: u8, cost: u32) -> Result<Quota, PolicyError> {
    let field = "local_share_percent";
    if !(1..=100).contains(&pct) {
        return Err(PolicyError::new(
            field,
            format!("must be between 1 and 100, got {pct}"),
        ));
    }
    let scale = |n: u64| (n * u64::from(pct) / 100).max(1);
    let local = Quota::new(
        scale(quota.capacity()),
        scale(quota.refill()),
        quota.period(),
    )
    .map_err(|e| PolicyError::new(field, format!("the scaled quota is invalid: {e}")))?;
    if u64::from(cost) > local.capacity() {
        return Err(PolicyError::new(
            field,
            format!(
                "{pct}% of the quota holds {} tokens, less than the cost {cost}: no request \
                 could ever pass locally",
                local.capacity()
            ),
        ));
    }
    Ok(local)
}

impl From<&Policy> for PolicySpec {
    fn from(p: &Policy) -> Self {
        let q = p.quota();
        Self {
            name: p.name.clone(),
            dimensions: p.dimensions.clone(),
            quota: QuotaSpec {
                capacity: q.capacity(),
                refill: (q.refill() != q.capacity()).then_some(q.refill()),
                period: match q.calendar() {
                    Some(c) => c.name().to_string(),
                    None => Period(q.period()).to_string(),
                },
            },
            cost: p.cost,
            failure_mode: p.failure_mode,
            local_share_percent: p.local_share_percent,
            max_in_flight: p.max_in_flight,
            // a calendar quota's algorithm is implied by its period
            algorithm: if q.calendar().is_some() {
                Algorithm::TokenBucket
            } else {
                q.algorithm()
            },
            shadow: p.shadow,
            consistency: p.consistency,
            max_overshoot: p.max_overshoot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"name":"default","dimensions":["api_key"],
        "quota":{"capacity":1000,"period":"1m"},"failure_mode":"fail_closed"}"#;

    fn err(json: &str) -> PolicyError {
        Policy::from_json(json).expect_err("must be rejected")
    }

    fn with(field: &str, value: &str) -> String {
        let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
        let (outer, inner) = field
            .split_once('.')
            .map_or((field, None), |(a, b)| (a, Some(b)));
        // a placeholder, swapped for the raw text so even invalid numbers get through
        let hole = serde_json::Value::from("__hole__");
        match inner {
            Some(inner) => v[outer][inner] = hole,
            None => v[outer] = hole,
        }
        v.to_string().replace("\"__hole__\"", value)
    }

    #[test]
    fn bounded_consistency_needs_a_bound_within_the_capacity_on_a_token_bucket() {
        let json = |extra: &str| {
            format!(
                r#"{{"name":"p","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1m"}},
                "failure_mode":"fail_closed"{extra}}}"#
            )
        };
        let p = Policy::from_json(&json(r#","consistency":"bounded","max_overshoot":10"#)).unwrap();
        assert_eq!(
            (p.consistency(), p.max_overshoot()),
            (Consistency::Bounded, Some(10))
        );
        let auto =
            Policy::from_json(&json(r#","consistency":"auto","max_overshoot":100"#)).unwrap();
        assert_eq!(auto.consistency(), Consistency::Auto);
        // the default is exact, and an exact policy serializes as before
        let exact = Policy::from_json(&json("")).unwrap();
        assert_eq!(
            (exact.consistency(), exact.max_overshoot()),
            (Consistency::Exact, None)
        );
        assert!(!exact.to_json().contains("consistency"));
        assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
        for (extra, field, says) in [
            (
                r#","consistency":"bounded""#,
                "max_overshoot",
                "is required",
            ),
            (r#","consistency":"auto""#, "max_overshoot", "is required"),
            (
                r#","consistency":"bounded","max_overshoot":0"#,
                "max_overshoot",
                "between 1 and",
            ),
            (
                r#","consistency":"bounded","max_overshoot":101"#,
                "max_overshoot",
                "got 101",
            ),
            (
                r#","consistency":"bounded","max_overshoot":-1"#,
                "max_overshoot",
                "invalid value",
            ),
            (
                r#","consistency":"bounded","max_overshoot":2.5"#,
                "max_overshoot",
                "invalid type",
            ),
            (
                r#","consistency":"bounded","max_overshoot":"5""#,
                "max_overshoot",
                "invalid type",
            ),
            (r#","max_overshoot":5"#, "max_overshoot", "only applies"),
            (
                r#","consistency":"eventual","max_overshoot":5"#,
                "consistency",
                "unknown variant",
            ),
            (
                r#","consistency":"bounded","max_overshoot":5,"algorithm":"fixed_window""#,
                "consistency",
                "cannot lease",
            ),
            (
                r#","consistency":"bounded","max_overshoot":5,"shadow":true"#,
                "consistency",
                "shadow",
            ),
            (
                r#","consistency":"auto","max_overshoot":5,"max_in_flight":3"#,
                "consistency",
                "max_in_flight",
            ),
        ] {
            let e = Policy::from_json(&json(extra)).expect_err(extra);
            assert_eq!(e.field, field, "{extra}: {e}");
            assert!(e.message.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn the_worked_policy_parses_and_derives_its_intervals() {
        let p = Policy::from_json(GOOD).unwrap();
        assert_eq!(p.name(), "default");
        assert_eq!(p.dimensions(), &[Dimension::ApiKey]);
        assert_eq!(p.quota().capacity(), 1000);
        assert_eq!(p.quota().emission_interval(), 60_000);
        assert_eq!(p.quota().burst_window(), 60_000_000);
        assert_eq!(p.cost(), 1);
        assert_eq!(p.failure_mode(), FailureMode::FailClosed);
    }

    #[test]
    fn local_fallback_scales_the_quota_and_validates_the_share() {
        let local = |pct: &str, cost: u32| {
            let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
            v["failure_mode"] = "local_fallback".into();
            v["local_share_percent"] = serde_json::from_str(pct).unwrap();
            v["cost"] = cost.into();
            Policy::from_json(&v.to_string())
        };
        let p = local("10", 1).unwrap();
        assert_eq!(p.failure_mode(), FailureMode::LocalFallback);
        let q = p.local_quota().unwrap();
        assert_eq!(
            (q.capacity(), q.refill(), q.period()),
            (100, 100, 60_000_000)
        );
        assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
        let tiny = local("1", 1).unwrap();
        assert_eq!(tiny.local_quota().unwrap().capacity(), 10);
        for (pct, cost) in [
            ("0", 1),
            ("101", 1),
            ("300", 1),
            ("-1", 1),
            ("0.5", 1),
            ("1", 11),
        ] {
            let e = local(pct, cost).unwrap_err();
            assert_eq!(e.field, "local_share_percent", "{pct}/{cost}: {e}");
        }
        // old documents (no new fields) parse as before and round-trip without them
        let old = Policy::from_json(GOOD).unwrap();
        assert!(old.local_quota().is_none() && old.max_in_flight().is_none());
        assert!(!old.to_json().contains("local_share") && !old.to_json().contains("in_flight"));
        let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
        v["max_in_flight"] = 20.into();
        let p = Policy::from_json(&v.to_string()).unwrap();
        assert_eq!(p.max_in_flight(), Some(20));
        assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn a_policy_survives_a_json_round_trip() {
        let p = Policy::from_json(&with("quota.refill", "10")).unwrap();
        assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn an_identity_policy_round_trips_alone_or_with_endpoint_and_client_ip() {
        for dims in [
            r#"["identity"]"#,
            r#"["endpoint","identity"]"#,
            r#"["identity","client_ip"]"#,
        ] {
            let p = Policy::from_json(&with("dimensions", dims)).unwrap();
            assert!(
                p.has(Dimension::Identity) && !p.has(Dimension::ApiKey),
                "{dims}"
            );
            assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
            assert!(p.to_json().contains(r#""identity""#));
        }
        assert_eq!(
            serde_json::to_string(&Dimension::Identity).unwrap(),
            r#""identity""#
        );
        let e = err(&with("dimensions", r#"["api_key","identity"]"#));
        assert!(e.message.contains("identity and api_key"), "{e}");
    }

    #[test]
    fn emission_interval_rounds_up_so_rounding_never_over_admits() {
        let q = Quota::new(7, 7, 60 * MICROS_PER_SEC).unwrap();
        assert_eq!(q.emission_interval(), 8_571_429);
        assert!(q.emission_interval() * 7 >= 60 * MICROS_PER_SEC);
    }

    /// Each bad value is rejected with a message naming the field it sits in.
    #[test]
    fn bad_values_are_rejected_naming_their_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("quota.capacity", "0", "quota.capacity"),
            ("quota.capacity", "-5", "quota.capacity"),
            ("quota.capacity", "1.5", "quota.capacity"),
            ("quota.capacity", "1e400", "quota.capacity"),
            ("quota.capacity", "18446744073709551616", "quota.capacity"),
            ("quota.capacity", "1000000001", "quota.capacity"),
            ("quota.capacity", "\"1000\"", "quota.capacity"),
            ("quota.capacity", "null", "quota.capacity"),
            ("quota.refill", "0", "quota.refill"),
            ("quota.refill", "-1", "quota.refill"),
            ("quota.period", "\"0s\"", "quota.period"),
            ("quota.period", "\"-1s\"", "quota.period"),
            ("quota.period", "\"1 m\"", "quota.period"),
            ("quota.period", "\"1y\"", "quota.period"),
            ("quota.period", "\"NaN\"", "quota.period"),
            ("quota.period", "\"inf\"", "quota.period"),
            ("quota.period", "\"99999999999999999999d\"", "quota.period"),
            ("quota.period", "\"400d\"", "quota.period"),
            ("quota.period", "60", "quota.period"),
            ("cost", "0", "cost"),
            ("cost", "1001", "cost"),
            ("cost", "4294967296", "cost"),
            ("name", "\"\"", "name"),
            ("name", "\"Default\"", "name"),
            ("name", "\"a b\"", "name"),
            ("name", "\"<script>\"", "name"),
            ("name", &format!("\"{}\"", "x".repeat(33)), "name"),
            ("dimensions", "[]", "dimensions"),
            ("dimensions", "[\"api_key\",\"api_key\"]", "dimensions"),
            ("dimensions", "[\"user\"]", "dimensions[0]"),
            ("dimensions", "[\"identity\",\"api_key\"]", "dimensions"),
            ("dimensions", "[\"identity\",\"identity\"]", "dimensions"),
            ("dimensions", "\"api_key\"", "dimensions"),
            ("failure_mode", "\"maybe\"", "failure_mode"),
            ("failure_mode", "\"local_fallback\"", "local_share_percent"),
            ("local_share_percent", "10", "local_share_percent"), // with fail_closed
            ("max_in_flight", "0", "max_in_flight"),
            ("max_in_flight", "100001", "max_in_flight"),
            ("max_in_flight", "-1", "max_in_flight"),
        ];
        for (field, value, named) in cases {
            let e = err(&with(field, value));
            assert_eq!(&e.field, named, "{field}={value} gave {e}");
            assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn a_bucket_that_would_take_over_400_days_to_fill_is_rejected() {
        // 1e9 tokens at one per minute: the window overflows the bound.
        let e = err(&with(
            "quota",
            r#"{"capacity":1000000000,"refill":1,"period":"1m"}"#,
        ));
        assert_eq!(e.field, "quota.capacity");
        assert!(e.message.contains("400d"), "{e}");
        // Faster than one token per microsecond.
        let e = err(&with(
            "quota",
            r#"{"capacity":10,"refill":1000000000,"period":"1s"}"#,
        ));
        assert_eq!(e.field, "quota.refill");
    }

    #[test]
    fn structural_garbage_is_rejected_with_a_clear_error() {
        for (doc, field) in [
            ("", "(document)"),
            ("[]", "(document)"),
            ("{", "(document)"),
            ("null", "(document)"),
            ("\u{0}\u{1}", "(document)"),
            (r#"{"name":"a"}"#, "(document)"),
            (
                &with("quota", r#"{"capacity":10,"period":"1s","extra":1}"#),
                "quota",
            ),
        ] {
            let e = err(doc);
            assert!(e.field.starts_with(field), "{doc:?} gave {e}");
        }
        let e = err(&format!("{{\"name\":\"{}\"}}", "a".repeat(MAX_POLICY_JSON)));
        assert!(e.message.contains("at most"), "{e}");
        // deep nesting must not overflow the stack
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(Policy::from_json(&deep).is_err());
    }

    #[test]
    fn calendar_periods_make_calendar_quotas_that_round_trip() {
        for (period, cal, longest) in [
            ("day", CalendarPeriod::Day, DAY),
            ("month", CalendarPeriod::Month, 31 * DAY),
        ] {
            let json = format!(
                r#"{{"name":"plan","dimensions":["api_key"],"quota":{{"capacity":10000,"period":"{period}"}},"cost":1,"failure_mode":"fail_closed"}}"#
            );
            let p = Policy::from_json(&json).unwrap();
            let q = p.quota();
            assert_eq!(q.calendar(), Some(cal));
            assert_eq!(q.algorithm(), Algorithm::FixedWindow);
            assert_eq!(
                (q.capacity(), q.refill(), q.period()),
                (10000, 10000, longest)
            );
            assert_eq!(p.to_json(), json);
            assert_eq!(Policy::from_json(&p.to_json()).unwrap(), p);
        }
        // a rolling day is not a calendar day
        let rolling = Policy::from_json(&with("quota.period", "\"1d\"")).unwrap();
        assert_eq!(rolling.quota().calendar(), None);
        assert_eq!(rolling.quota().algorithm(), Algorithm::TokenBucket);
    }

    #[test]
    fn calendar_periods_refuse_what_does_not_apply_naming_the_field() {
        let month = |extra: &str| {
            format!(
                r#"{{"name":"p","dimensions":["api_key"],"quota":{{"capacity":100,"period":"month"{extra}}},"failure_mode":"fail_open"}}"#
            )
        };
        let top = |field: &str| {
            format!(
                r#"{{"name":"p","dimensions":["api_key"],"quota":{{"capacity":100,"period":"month"}},"failure_mode":"fail_open",{field}}}"#
            )
        };
        for (json, field) in [
            (month(r#","refill":10"#), "quota.refill"),
            (top(r#""algorithm":"sliding_log""#), "algorithm"),
            (top(r#""algorithm":"fixed_window""#), "algorithm"),
            (
                top(r#""consistency":"bounded","max_overshoot":5"#),
                "consistency",
            ),
            (month("").replace("100", "0"), "quota.capacity"),
            (month("").replace("month", "Month"), "quota.period"),
            (month("").replace("month", "week"), "quota.period"),
        ] {
            assert_eq!(err(&json).field, field, "{json}");
        }
        // a refill equal to the capacity is the default, written out
        let same = month(r#","refill":100"#);
        assert!(Policy::from_json(&same).is_ok());
    }

    #[test]
    fn the_short_form_parses_limit_and_period() {
        let q = Quota::parse_short("1000/1m").unwrap();
        assert_eq!(
            (q.capacity(), q.refill(), q.period()),
            (1000, 1000, 60_000_000)
        );
        for (bad, field) in [
            ("1000", "quota"),
            ("x/1m", "quota.capacity"),
            ("-1/1m", "quota.capacity"),
            ("0/1m", "quota.capacity"),
            ("10/", "quota.period"),
            ("10/1y", "quota.period"),
        ] {
            assert_eq!(Quota::parse_short(bad).unwrap_err().field, field, "{bad}");
        }
    }

    #[test]
    fn periods_parse_and_print_in_one_unit() {
        for (text, us) in [
            ("500ms", 500_000),
            ("60s", 60_000_000),
            ("1m", 60_000_000),
            ("2h", 7_200_000_000),
            ("1d", 86_400_000_000),
        ] {
            assert_eq!(Period::parse(text).unwrap().0, us);
        }
        assert_eq!(Period(60_000_000).to_string(), "1m");
        assert_eq!(Period(1_500_000).to_string(), "1500ms");
        for bad in ["", "ms", "1", "1.5s", "+1s", "1S", "１s", "1sec"] {
            assert!(Period::parse(bad).is_err(), "{bad:?}");
        }
    }
}
