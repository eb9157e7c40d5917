//! What the pages and the server functions exchange, and the pure pieces of the
//! dashboard (a policy described, percentiles), which build for the server and the
//! browser alike and are tested natively. The forms are in `forms`.

use std::collections::BTreeMap;

use floodgate_shared::config::{ConfigSpec, Source};
use floodgate_shared::policy::{Consistency, FailureMode, PolicyError, PolicySpec};
use floodgate_shared::stats::Endpoint;
use serde::{Deserialize, Serialize};

/// The signed-in operator, and the token every mutation must carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub user: String,
    pub csrf: String,
    /// The edge's address as the dashboard was told (`--edge-url`), for the
    /// pages' example requests.
    pub edge_url: Option<String>,
}

/// What the pages write for the edge's address when the dashboard was not told it.
pub const EDGE_URL_PLACEHOLDER: &str = "EDGE_URL";

/// A request through the edge with API key `secret`, ready to paste: `curl -i`
/// shows the status (200, or 429 when throttled) and the rate-limit headers.
pub fn try_request(edge_url: Option<&str>, secret: &str, path: &str) -> String {
    let base = edge_url
        .unwrap_or(EDGE_URL_PLACEHOLDER)
        .trim_end_matches('/');
    format!("curl -i -H \"Authorization: Bearer {secret}\" {base}{path}")
}

/// A path of the configuration to try a key on: the first route's pattern when it
/// has no parameters, else `/`.
pub fn example_path(spec: Option<&ConfigSpec>) -> String {
    spec.and_then(|s| s.routes.iter().find(|r| !r.pattern.contains([':', '*'])))
        .map_or_else(|| "/".to_string(), |r| r.pattern.clone())
}

/// The stored configuration and its version (the SHA-1 of its text; empty when
/// nothing is stored yet). A save names the version it was based on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    pub version: String,
    pub spec: Option<ConfigSpec>,
}

/// Why a server function refused: the one error type of the dashboard's API, sent
/// as JSON with the HTTP status of [`AppError::status`] (the guard sets it, for the
/// guard's own refusals too), so the pages tell a session that ended from an outage
/// from a field error without reading text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AppError {
    /// No session, or it ended (expired, signed out): sign in again. 401.
    SignedOut,
    /// Wrong user name or password. 401.
    WrongCredentials,
    /// Too many sign-in attempts from here; try again after `wait_secs`. 429.
    TooManyAttempts { wait_secs: u64 },
    /// Refused: not from the dashboard's own pages, or the form's CSRF token is
    /// missing or stale. 403.
    Forbidden(String),
    /// A field of the form is invalid: `field` as the edge's validation names it
    /// (to place the message next to the form's field), `label` as an operator
    /// reads it. 422.
    Invalid {
        field: String,
        label: String,
        message: String,
    },
    /// Someone saved the configuration after this form was loaded. 409.
    Conflict(String),
    /// The dashboard's store (Redis) cannot be reached. 503.
    Unavailable(String),
    /// The request could not be read (a missing or malformed field). 400.
    BadRequest(String),
    /// The dashboard's server cannot be reached (seen in the browser only).
    Unreachable(String),
    /// Anything else. 500.
    Internal(String),
}

impl AppError {
    /// A field error whose label is the field itself.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        AppError::Invalid {
            label: crate::describe::describe_field(&field, None),
            field,
            message: message.into(),
        }
    }

    /// An error of the edge's validation: on the form field it is about (a list
    /// element's index is dropped, `policies[2]` → `policies`, since a form edits the
    /// list as one field), labelled for operators with the names `spec` gives the
    /// indexes (`routes[0].policies` → `Route "search", limits`).
    pub fn from_policy(e: PolicyError, spec: Option<&ConfigSpec>) -> Self {
        let label = crate::describe::describe_field(&e.field, spec);
        let mut field = e.field;
        while field.ends_with(']') {
            match field.rfind('[') {
                Some(i)
                    if field[i + 1..field.len() - 1]
                        .bytes()
                        .all(|b| b.is_ascii_digit()) =>
                {
                    field.truncate(i)
                }
                _ => break,
            }
        }
        AppError::Invalid {
            field,
            label,
            message: e.message,
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            AppError::SignedOut | AppError::WrongCredentials => 401,
            AppError::TooManyAttempts { .. } => 429,
            AppError::Forbidden(_) => 403,
            AppError::Invalid { .. } => 422,
            AppError::Conflict(_) => 409,
            AppError::Unavailable(_) => 503,
            AppError::BadRequest(_) => 400,
            AppError::Unreachable(_) => 502,
            AppError::Internal(_) => 500,
        }
    }

    /// The message for `field` of a form, if this error is about it.
    pub fn message_for(&self, field: &str) -> Option<String> {
        match self {
            AppError::Invalid {
                field: f, message, ..
            } if f == field => Some(message.clone()),
            _ => None,
        }
    }

    /// Whether the page should show this as an outage banner.
    pub fn is_outage(&self) -> bool {
        matches!(self, AppError::Unavailable(_) | AppError::Unreachable(_))
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::SignedOut => f.write_str("Your session has ended; sign in again."),
            AppError::WrongCredentials => f.write_str("Wrong user name or password"),
            AppError::TooManyAttempts { wait_secs } => {
                write!(f, "Too many sign-in attempts; try again in {wait_secs} s")
            }
            AppError::Invalid { label, message, .. } => write!(f, "{label}: {message}"),
            AppError::Forbidden(m) | AppError::Conflict(m) | AppError::BadRequest(m) => {
                f.write_str(m)
            }
            AppError::Unavailable(m) => write!(
                f,
                "The dashboard cannot reach its store (Redis): {m}. Nothing was changed; \
                 it retries on its own."
            ),
            AppError::Unreachable(m) => write!(
                f,
                "The dashboard's server cannot be reached ({m}); it retries on its own."
            ),
            AppError::Internal(m) => write!(f, "Internal error: {m}"),
        }
    }
}

impl std::error::Error for AppError {}

impl leptos::server_fn::error::FromServerFnError for AppError {
    type Encoder = leptos::server_fn::codec::JsonEncoding;

    fn from_server_fn_error(e: leptos::server_fn::error::ServerFnErrorErr) -> Self {
        use leptos::server_fn::error::ServerFnErrorErr as E;
        match e {
            E::Args(m) => AppError::BadRequest(format!("the form could not be read: {m}")),
            E::MissingArg(m) => AppError::BadRequest(format!("the form lacks the field {m}")),
            E::Request(m) => AppError::Unreachable(m),
            other => AppError::Internal(other.to_string()),
        }
    }
}

/// What a form answers when it is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Saved {
    /// Saved (the message says what).
    Ok(String),
    /// A backtest of the form's proposal (nothing saved).
    Preview(Backtest),
}

/// The edge's recent decisions replayed against the current configuration and
/// against a proposal, with what the replay cannot see.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backtest {
    /// Decisions in the sample, and the period they span (Unix ms).
    pub sampled: u64,
    pub from_ms: i64,
    pub to_ms: i64,
    /// Decisions the edges made in that period but could not add to the sample.
    pub dropped: u64,
    /// Sampled decisions taken without Redis: replayed as if Redis had answered.
    pub degraded: u64,
    /// Policies keyed by client address, which the sample cannot replay.
    pub ip_policies: Vec<String>,
    pub rows: Vec<BacktestRow>,
    /// Route name → its path pattern (of the stored configuration).
    pub patterns: BTreeMap<String, String>,
}

/// One endpoint of a backtest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BacktestRow {
    pub endpoint: Endpoint,
    pub requests: u64,
    /// 429s the edge answered these requests (its own record).
    pub observed: u64,
    /// 429s the current configuration gives these requests when replayed.
    pub throttled_now: u64,
    /// 429s the proposal would give, and to how many of the keys seen.
    pub throttled: u64,
    pub keys: u64,
    pub keys_seen: u64,
    /// Requests a shadow policy of the proposal would have throttled.
    pub shadow: u64,
}

/// A key as the dashboard lists it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: String,
    pub label: String,
    pub plan: String,
    pub revoked: bool,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds of the key's latest decision at any edge.
    pub last_used: Option<i64>,
    /// Decisions over the last hour.
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
}

/// One identity on the identities page: its keys, their decisions over the last
/// hour together (they share the buckets of `identity` policies), and the
/// configuration's override of their plans, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRow {
    pub identity: String,
    pub keys: Vec<KeyRow>,
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
    pub plan: Option<String>,
    pub policies: Option<Vec<String>>,
}

/// The identities page: every identity some key holds, and what the forms need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentitiesView {
    pub identities: Vec<IdentityRow>,
    pub plans: Vec<String>,
}

/// One key in detail (never its secret): the key page's fields, its rotation's
/// overlap, and the version its forms change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDetailView {
    pub row: KeyRow,
    pub identity: Option<String>,
    pub name: Option<String>,
    /// Compact JSON.
    pub metadata: Option<String>,
    /// Unix seconds.
    pub expires_at: Option<i64>,
    /// Compact JSON, as set (the live count is in Redis).
    pub credits: Option<String>,
    /// Unix seconds until which the secret a rotation replaced still works.
    pub previous_secret_until: Option<i64>,
    pub version: String,
}

/// A key just created: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    pub id: String,
    pub secret: String,
}

/// One policy applying to a key on an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveRow {
    pub policy: String,
    pub source: Source,
    pub limit: String,
    pub cost: u32,
    pub failure_mode: String,
}

/// The traffic page's time range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Range {
    Minutes15,
    Hour1,
    Hours24,
}

/// The width of one bar of the traffic charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolution {
    Seconds10,
    Minute1,
    Minutes10,
    Hour1,
}

impl Range {
    pub const ALL: [Range; 3] = [Range::Minutes15, Range::Hour1, Range::Hours24];

    pub fn secs(self) -> i64 {
        match self {
            Range::Minutes15 => 900,
            Range::Hour1 => 3_600,
            Range::Hours24 => 86_400,
        }
    }

    /// The query value (`?range=`).
    pub fn code(self) -> &'static str {
        match self {
            Range::Minutes15 => "15m",
            Range::Hour1 => "1h",
            Range::Hours24 => "24h",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Range::Minutes15 => "15 minutes",
            Range::Hour1 => "1 hour",
            Range::Hours24 => "24 hours",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Range::ALL.into_iter().find(|r| r.code() == code)
    }

    /// How often the traffic page refreshes this range (seconds).
    pub fn refresh_secs(self) -> u64 {
        match self {
            Range::Minutes15 | Range::Hour1 => 3,
            Range::Hours24 => 30,
        }
    }

    /// The resolutions offered for this range, the default first.
    pub fn resolutions(self) -> &'static [Resolution] {
        match self {
            Range::Minutes15 => &[Resolution::Seconds10, Resolution::Minute1],
            Range::Hour1 => &[Resolution::Minute1, Resolution::Seconds10],
            Range::Hours24 => &[Resolution::Minutes10, Resolution::Hour1],
        }
    }

    /// `res` if this range offers it, else the default.
    pub fn resolution(self, res: Option<Resolution>) -> Resolution {
        res.filter(|r| self.resolutions().contains(r))
            .unwrap_or(self.resolutions()[0])
    }
}

impl Resolution {
    pub fn secs(self) -> i64 {
        match self {
            Resolution::Seconds10 => 10,
            Resolution::Minute1 => 60,
            Resolution::Minutes10 => 600,
            Resolution::Hour1 => 3_600,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Resolution::Seconds10 => "10s",
            Resolution::Minute1 => "1m",
            Resolution::Minutes10 => "10m",
            Resolution::Hour1 => "1h",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Resolution::Seconds10 => "10 s",
            Resolution::Minute1 => "1 min",
            Resolution::Minutes10 => "10 min",
            Resolution::Hour1 => "1 h",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        [
            Resolution::Seconds10,
            Resolution::Minute1,
            Resolution::Minutes10,
            Resolution::Hour1,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }
}

/// Counts of one endpoint per bar.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub allowed: Vec<u64>,
    pub throttled: Vec<u64>,
    pub degraded: Vec<u64>,
    /// Admitted requests a shadow policy would have throttled.
    pub shadow: Vec<u64>,
}

impl Series {
    pub fn zeros(n: usize) -> Self {
        Series {
            allowed: vec![0; n],
            throttled: vec![0; n],
            degraded: vec![0; n],
            shadow: vec![0; n],
        }
    }
}

/// The traffic page's data: bar `i` covers `[start + i × step, start + (i+1) × step)`
/// (Unix seconds, UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    pub range: Range,
    pub resolution: Resolution,
    pub start: i64,
    pub bars: usize,
    /// Per endpoint, in the order [`Endpoint`] sorts (routes by name, unmatched last).
    pub endpoints: Vec<(Endpoint, Series)>,
    /// Route name → its path pattern (of the stored configuration).
    pub patterns: BTreeMap<String, String>,
    /// (key id, 429s) over the last `top_minutes` minutes, most throttled first.
    pub top_throttled: Vec<(String, u64)>,
    pub top_minutes: u32,
    /// Store-call latency per bar, µs (None when no call was made).
    pub p50_us: Vec<Option<u64>>,
    pub p99_us: Vec<Option<u64>>,
    /// Decisions taken without Redis over the range: per failure mode, and per
    /// (endpoint, mode).
    pub degraded_by_mode: Vec<(FailureMode, u64)>,
    pub degraded_by_endpoint_mode: Vec<(Endpoint, FailureMode, u64)>,
    /// Circuit-breaker openings and time open (ms) over the range, all edges.
    pub breaker_opened: u64,
    pub breaker_open_ms: u64,
    /// Requests refused by each deny list over the range, all edges.
    pub denied: Vec<(floodgate_shared::deny::DenyList, u64)>,
}

/// The traffic page's consistency figures: each configured bounded or `auto`
/// policy over the range, by name (per minute: the edges count them per minute
/// only). Rendered on the server, outside the page's island, so the browser
/// bundle carries none of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasingFigures {
    pub policies: Vec<PolicyLeasing>,
    /// The configuration's `regions` (regional pools holding credit).
    pub regions: u32,
}

impl Traffic {
    pub fn step(&self) -> i64 {
        self.resolution.secs()
    }
}

/// How the pages name an endpoint: its path pattern and route name, or the one
/// name of unmatched traffic.
pub fn endpoint_label(e: &Endpoint, patterns: &BTreeMap<String, String>) -> String {
    match e {
        Endpoint::Unmatched => UNMATCHED.to_string(),
        Endpoint::Route(r) => match patterns.get(r) {
            Some(p) => format!("{p} (route {r})"),
            None => format!("route {r} (no longer configured)"),
        },
    }
}

/// The one name of traffic that matched no route, on every page.
pub const UNMATCHED: &str = "Unmatched paths (no route)";

/// An audit record as the page shows it: the fields the change touched, or, when
/// the item's text was cut for the log (not JSON any more), the texts as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRow {
    pub at: i64,
    pub user: String,
    pub action: String,
    pub target: String,
    pub changes: Option<Vec<crate::describe::Change>>,
    /// The item was created (nothing before) or removed (nothing after).
    pub created: bool,
    pub removed: bool,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl From<AuditEntry> for AuditRow {
    fn from(e: AuditEntry) -> Self {
        let changes = crate::describe::diff(e.before.as_deref(), e.after.as_deref());
        let raw = changes.is_none();
        AuditRow {
            at: e.at,
            user: e.user,
            action: e.action,
            target: e.target,
            changes,
            created: e.before.is_none(),
            removed: e.after.is_none(),
            before: e.before.filter(|_| raw),
            after: e.after.filter(|_| raw),
        }
    }
}

/// One audit record (the type the CLI's audited saves write too).
pub use floodgate_shared::audit::AuditEntry;

pub fn dimension_name(d: floodgate_shared::policy::Dimension) -> &'static str {
    use floodgate_shared::policy::Dimension::*;
    match d {
        ApiKey => "api_key",
        Endpoint => "endpoint",
        ClientIp => "client_ip",
        Identity => "identity",
    }
}

pub fn failure_mode_name(p: &PolicySpec) -> String {
    serde_json::to_value(p.failure_mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// "1000 / 1m" (or "1000 per 1m, burst 2000" when refill differs), with the
/// algorithm when it is not the token bucket.
pub fn describe_quota(p: &PolicySpec) -> String {
    let base = match p.quota.refill {
        Some(r) if r != p.quota.capacity => {
            format!("{r} / {}, burst {}", p.quota.period, p.quota.capacity)
        }
        _ => format!("{} / {}", p.quota.capacity, p.quota.period),
    };
    match p.algorithm {
        floodgate_shared::policy::Algorithm::TokenBucket => base,
        a => format!("{base} ({})", a.name().replace('_', " ")),
    }
}

/// How a policy is decided across edges, as the policy list shows it: `exact`, or
/// `bounded, at most 50 over` (tokens above the quota in any window).
pub fn describe_consistency(p: &PolicySpec) -> String {
    consistency_label(p.consistency, p.max_overshoot)
}

fn consistency_label(c: Consistency, bound: Option<u64>) -> String {
    match (c, bound) {
        (Consistency::Exact, _) => "exact".to_string(),
        (c, Some(n)) => format!("{}, at most {n} over", c.name()),
        (c, None) => c.name().to_string(),
    }
}

/// A bounded or `auto` policy's consistency figures over the traffic page's range:
/// the edges' `policy:<name>|local|exact|refills|outstanding` counters
/// ([`floodgate_shared::stats::Leasing`]) summed, with the policy's bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyLeasing {
    pub policy: String,
    pub consistency: Consistency,
    /// The policy's `max_overshoot`.
    pub bound: u64,
    /// What the global store leases of the bound: the bound less what the regions
    /// may admit on credit (the edge's own `LeaseSettings::for_policy` computes it).
    pub leasable: u64,
    /// Requests decided from tokens at hand, and on the exact path.
    pub local: u64,
    pub exact: u64,
    /// Global calls that refilled a lease or a regional pool.
    pub refills: u64,
    /// Tokens outstanding at those refills, summed.
    pub outstanding: u64,
}

impl PolicyLeasing {
    /// Share of the policy's decisions taken locally (0-1); `None` without any.
    pub fn local_share(&self) -> Option<f64> {
        let all = self.local.saturating_add(self.exact);
        (all > 0).then(|| self.local as f64 / all as f64)
    }

    /// Global Redis calls saved: one per local decision, less one per refill
    /// (negative when refills cost more than the local decisions saved).
    pub fn calls_saved(&self) -> i128 {
        i128::from(self.local) - i128::from(self.refills)
    }

    /// Mean tokens outstanding at a refill; `None` without refills.
    pub fn mean_outstanding(&self) -> Option<f64> {
        (self.refills > 0).then(|| self.outstanding as f64 / self.refills as f64)
    }

    /// `bounded, at most 50 over`.
    pub fn label(&self) -> String {
        consistency_label(self.consistency, Some(self.bound))
    }

    pub fn local_text(&self) -> String {
        match self.local_share() {
            None => "no decisions in this range".to_string(),
            Some(s) => format!(
                "{:.1} % ({} of {} decisions)",
                s * 100.0,
                self.local,
                self.local + self.exact
            ),
        }
    }

    pub fn saved_text(&self) -> String {
        let (local, refills) = (self.local, self.refills);
        match self.calls_saved() {
            n if n > 0 => format!("{n} ({local} local decisions, less {refills} refills)"),
            _ if local == 0 && refills == 0 => {
                "none yet (no local decisions or refills in this range)".to_string()
            }
            0 => format!(
                "none: {refills} refills cost as many global calls as the {local} local decisions saved"
            ),
            n => format!(
                "none: {refills} refills cost {} more global calls than the {local} local decisions saved (keys too cold for leases to pay)",
                -n
            ),
        }
    }

    pub fn budget_text(&self) -> String {
        match self.mean_outstanding() {
            None => "no refills in this range".to_string(),
            Some(mean) => format!(
                "{mean:.1} of {} tokens ({:.0} %), the mean outstanding at {} refills",
                self.leasable,
                100.0 * mean / self.leasable.max(1) as f64,
                self.refills
            ),
        }
    }
}

/// The upper bound (µs) of the histogram bucket holding quantile `q` of the
/// latency histogram `(upper bound µs, count)`; `None` for an empty histogram.
/// Bounds are the edge's (`lat|<µs>`, `lat|inf` as `u64::MAX`).
pub fn histogram_quantile(hist: &[(u64, u64)], q: f64) -> Option<u64> {
    let mut sorted = hist.to_vec();
    sorted.sort_unstable();
    let total: u64 = sorted.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bound, n) in sorted {
        seen += n;
        if seen >= rank {
            return Some(bound);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_figures_read_as_shares_calls_and_tokens() {
        let l = PolicyLeasing {
            policy: "search".into(),
            consistency: Consistency::Bounded,
            bound: 50,
            leasable: 26,
            local: 930,
            exact: 70,
            refills: 20,
            outstanding: 260,
        };
        assert_eq!(l.label(), "bounded, at most 50 over");
        assert_eq!(l.local_text(), "93.0 % (930 of 1000 decisions)");
        assert_eq!(l.saved_text(), "910 (930 local decisions, less 20 refills)");
        assert_eq!(
            l.budget_text(),
            "13.0 of 26 tokens (50 %), the mean outstanding at 20 refills"
        );
        // refills costing more than they saved are explained, never negative
        let cold = PolicyLeasing {
            local: 3,
            refills: 12,
            ..l.clone()
        };
        assert_eq!(cold.calls_saved(), -9);
        assert!(
            cold.saved_text()
                .starts_with("none: 12 refills cost 9 more"),
            "{}",
            cold.saved_text()
        );
        let even = PolicyLeasing {
            local: 12,
            refills: 12,
            ..l.clone()
        };
        assert!(
            even.saved_text()
                .starts_with("none: 12 refills cost as many")
        );
        let idle = PolicyLeasing {
            local: 0,
            exact: 0,
            refills: 0,
            outstanding: 0,
            ..l
        };
        assert_eq!(idle.local_text(), "no decisions in this range");
        assert!(idle.saved_text().starts_with("none yet"));
        assert_eq!(idle.budget_text(), "no refills in this range");
    }

    #[test]
    fn a_key_is_tried_on_the_edge_with_a_pasteable_curl() {
        assert_eq!(
            try_request(Some("https://edge.example/"), "fg_k", "/v1/search"),
            "curl -i -H \"Authorization: Bearer fg_k\" https://edge.example/v1/search"
        );
        assert!(try_request(None, "fg_k", "/").ends_with(" EDGE_URL/"));
        let spec: ConfigSpec = serde_json::from_str(
            r#"{"policies":[],"plans":{},"routes":[{"name":"u","pattern":"/v1/users/:id","policies":[]},{"name":"s","pattern":"/v1/search","policies":[]}]}"#,
        )
        .unwrap();
        assert_eq!(example_path(Some(&spec)), "/v1/search");
        assert_eq!(example_path(None), "/");
    }

    #[test]
    fn quantiles_come_from_the_histogram_bounds() {
        let h = [(250, 90), (1000, 9), (u64::MAX, 1)];
        assert_eq!(histogram_quantile(&h, 0.5), Some(250));
        assert_eq!(histogram_quantile(&h, 0.99), Some(1000));
        assert_eq!(histogram_quantile(&h, 1.0), Some(u64::MAX));
        assert_eq!(histogram_quantile(&[], 0.5), None);
        assert_eq!(histogram_quantile(&[(250, 0)], 0.5), None);
    }
}
