//! What the pages and the server functions exchange, and the pure pieces of the
//! dashboard (form → policy, chart geometry, percentiles), which build for the
//! server and the browser alike and are tested natively.

use std::collections::BTreeMap;

use floodgate_shared::config::{ConfigSpec, Source};
use floodgate_shared::policy::{Policy, PolicyError, PolicySpec};
use serde::{Deserialize, Serialize};

/// The signed-in operator, and the token every mutation must carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub user: String,
    pub csrf: String,
}

/// The stored configuration and its version (the SHA-1 of its text; empty when
/// nothing is stored yet). A save names the version it was based on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    pub version: String,
    pub spec: Option<ConfigSpec>,
}

/// The answer to a form: saved, or why not (next to `field` when it names one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Saved {
    Ok(String),
    Invalid {
        field: String,
        message: String,
    },
    /// Someone else saved since this form was loaded.
    Conflict(String),
    /// A backtest of the form's proposal (nothing saved).
    Preview {
        sampled: u64,
        rows: Vec<BacktestRow>,
    },
}

/// One endpoint of a backtest: the edge's recent requests replayed against the
/// current configuration and against the proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BacktestRow {
    pub route: String,
    pub requests: u64,
    /// 429s the current configuration gives these requests.
    pub throttled_now: u64,
    /// 429s the proposal would give, and to how many of the keys seen.
    pub throttled: u64,
    pub keys: u64,
    pub keys_seen: u64,
    /// Requests a shadow policy of the proposal would have throttled.
    pub shadow: u64,
}

impl Saved {
    /// An error of the edge's validation, on the form field it is about: a list
    /// element's index is dropped (`policies[2]` → `policies`), since the form edits
    /// the list as one field.
    pub fn invalid(e: PolicyError) -> Self {
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
        Saved::Invalid {
            field,
            message: e.message,
        }
    }

    /// The message to show next to `field`, if this answer is about it.
    pub fn message_for(&self, field: &str) -> Option<String> {
        match self {
            Saved::Invalid { field: f, message } if f == field => Some(message.clone()),
            _ => None,
        }
    }

    /// The message for the whole form: success, conflict, or an error on a field the
    /// form does not show.
    pub fn form_message(&self, fields: &[&str]) -> Option<(bool, String)> {
        match self {
            Saved::Ok(m) => Some((true, m.clone())),
            Saved::Conflict(m) => Some((false, m.clone())),
            Saved::Invalid { field, message } if !fields.contains(&field.as_str()) => {
                Some((false, format!("{field}: {message}")))
            }
            Saved::Invalid { .. } | Saved::Preview { .. } => None,
        }
    }
}

/// A key as the dashboard lists it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRow {
    pub id: String,
    pub label: String,
    pub plan: String,
    pub revoked: bool,
    pub created: i64,
    /// Decisions over the last hour.
    pub allowed: u64,
    pub throttled: u64,
    pub degraded: u64,
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

/// Per-minute counts of one endpoint (or key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub allowed: Vec<u64>,
    pub throttled: Vec<u64>,
    pub degraded: Vec<u64>,
    /// Admitted requests a shadow policy would have throttled.
    pub shadow: Vec<u64>,
}

/// The traffic page's data: `minutes` (Unix minutes, oldest first) index every series.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    pub minutes: Vec<i64>,
    pub routes: BTreeMap<String, Series>,
    /// (key id, throttled) over the window, most throttled first.
    pub top_throttled: Vec<(String, u64)>,
    /// Store-call latency per minute, µs (None when no call was made).
    pub p50_us: Vec<Option<u64>>,
    pub p99_us: Vec<Option<u64>>,
    /// Decisions taken without Redis over the window: per failure mode, and per
    /// (route, mode).
    pub degraded_by_mode: BTreeMap<String, u64>,
    pub degraded_by_route_mode: BTreeMap<(String, String), u64>,
    /// Circuit-breaker openings and time open (ms) over the window, all edges.
    pub breaker_opened: u64,
    pub breaker_open_ms: u64,
}

/// One audit record (the type the CLI's audited saves write too).
pub use floodgate_shared::audit::AuditEntry;

/// The most characters any text field of a form takes (names, labels, patterns).
pub const MAX_FIELD_CHARS: usize = 256;

/// Checks one raw form field's size before anything parses it.
pub fn bounded<'a>(field: &str, raw: &'a str) -> Result<&'a str, PolicyError> {
    let t = raw.trim();
    if t.chars().count() > MAX_FIELD_CHARS {
        return Err(PolicyError::new(
            field,
            format!("is longer than {MAX_FIELD_CHARS} characters"),
        ));
    }
    Ok(t)
}

fn whole_number(field: &str, raw: &str) -> Result<Option<serde_json::Value>, PolicyError> {
    let t = bounded(field, raw)?;
    if t.is_empty() {
        return Ok(None);
    }
    // Digits go to the shared parser as numbers, so its range checks apply
    // (zero, overflow); anything else is refused here with a plain message.
    if t.bytes().all(|b| b.is_ascii_digit()) && t.len() <= 20 {
        return match t.parse::<u64>() {
            Ok(n) => Ok(Some(serde_json::Value::from(n))),
            Err(_) => Err(PolicyError::new(field, "is too large")),
        };
    }
    let shown: String = t.chars().take(24).collect();
    Err(PolicyError::new(
        field,
        format!("must be a whole number, got {shown:?}"),
    ))
}

/// The policy form's raw fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyForm {
    pub name: String,
    /// Comma-separated: `api_key`, `endpoint`, `client_ip`.
    pub dimensions: String,
    pub capacity: String,
    pub period: String,
    pub refill: String,
    pub cost: String,
    pub failure_mode: String,
    /// With `local_fallback`: the share (1–100 %) of the quota each instance
    /// enforces alone while Redis is unavailable.
    pub local_share_percent: String,
    /// Requests of one bucket in flight at once (empty: no limit).
    pub max_in_flight: String,
    /// `token_bucket` (default when empty), `fixed_window`, `sliding_log`,
    /// `sliding_counter`.
    pub algorithm: String,
    /// Shadow (dry-run) mode.
    pub shadow: bool,
}

/// The form fields a policy error can name, as `PolicySpec` names them.
pub const POLICY_FIELDS: [&str; 11] = [
    "algorithm",
    "shadow",
    "name",
    "dimensions",
    "quota.capacity",
    "quota.period",
    "quota.refill",
    "cost",
    "failure_mode",
    "local_share_percent",
    "max_in_flight",
];

impl PolicyForm {
    /// Validates the form with the edge's own parser and rules; errors name the
    /// field as the edge would (`quota.capacity`, ...).
    pub fn to_spec(&self) -> Result<PolicySpec, PolicyError> {
        let mut quota = serde_json::Map::new();
        let capacity = whole_number("quota.capacity", &self.capacity)?
            .ok_or_else(|| PolicyError::new("quota.capacity", "is required"))?;
        quota.insert("capacity".into(), capacity);
        if let Some(refill) = whole_number("quota.refill", &self.refill)? {
            quota.insert("refill".into(), refill);
        }
        quota.insert(
            "period".into(),
            bounded("quota.period", &self.period)?.into(),
        );
        let dimensions: Vec<&str> = bounded("dimensions", &self.dimensions)?
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        let mut doc = serde_json::Map::new();
        doc.insert("name".into(), bounded("name", &self.name)?.into());
        doc.insert("dimensions".into(), dimensions.into());
        doc.insert("quota".into(), quota.into());
        if let Some(cost) = whole_number("cost", &self.cost)? {
            doc.insert("cost".into(), cost);
        }
        doc.insert(
            "failure_mode".into(),
            bounded("failure_mode", &self.failure_mode)?.into(),
        );
        if let Some(share) = whole_number("local_share_percent", &self.local_share_percent)? {
            doc.insert("local_share_percent".into(), share);
        }
        if let Some(n) = whole_number("max_in_flight", &self.max_in_flight)? {
            doc.insert("max_in_flight".into(), n);
        }
        let algorithm = bounded("algorithm", &self.algorithm)?;
        if !algorithm.is_empty() {
            doc.insert("algorithm".into(), algorithm.into());
        }
        if self.shadow {
            doc.insert("shadow".into(), true.into());
        }
        let policy = Policy::from_json(&serde_json::Value::Object(doc).to_string())?;
        Ok(serde_json::from_str(&policy.to_json()).expect("a valid policy's JSON is a spec"))
    }

    pub fn from_spec(p: &PolicySpec) -> Self {
        PolicyForm {
            name: p.name.clone(),
            dimensions: p
                .dimensions
                .iter()
                .map(|d| dimension_name(*d))
                .collect::<Vec<_>>()
                .join(","),
            capacity: p.quota.capacity.to_string(),
            period: p.quota.period.clone(),
            refill: p.quota.refill.map(|r| r.to_string()).unwrap_or_default(),
            cost: p.cost.to_string(),
            failure_mode: failure_mode_name(p),
            local_share_percent: p
                .local_share_percent
                .map(|v| v.to_string())
                .unwrap_or_default(),
            max_in_flight: p.max_in_flight.map(|v| v.to_string()).unwrap_or_default(),
            algorithm: p.algorithm.name().to_string(),
            shadow: p.shadow,
        }
    }
}

pub fn dimension_name(d: floodgate_shared::policy::Dimension) -> &'static str {
    use floodgate_shared::policy::Dimension::*;
    match d {
        ApiKey => "api_key",
        Endpoint => "endpoint",
        ClientIp => "client_ip",
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

/// Splits a comma-separated list of names (policy lists in plan/route forms).
pub fn name_list(field: &str, raw: &str) -> Result<Vec<String>, PolicyError> {
    Ok(bounded(field, raw)?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
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

/// An SVG chart's drawing box.
pub const CHART_W: f64 = 600.0;
pub const CHART_H: f64 = 160.0;

/// The points of a polyline for `values` scaled to `max` over the chart box
/// (`None` values break nothing: they are drawn at 0).
pub fn polyline(values: &[Option<u64>], max: u64) -> String {
    let n = values.len().max(2) - 1;
    let max = max.max(1) as f64;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = CHART_W * i as f64 / n as f64;
            let y = CHART_H - CHART_H * (v.unwrap_or(0) as f64).min(max) / max;
            format!("{x:.1},{y:.1}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The y coordinate of a horizontal line at `value` on a chart scaled to `max`.
pub fn level(value: u64, max: u64) -> f64 {
    let max = max.max(1) as f64;
    CHART_H - CHART_H * (value as f64).min(max) / max
}

/// A "nice" axis maximum ≥ `v` (1, 2, 5 × 10^k).
pub fn nice_max(v: u64) -> u64 {
    let mut m = 1u64;
    loop {
        for f in [1, 2, 5] {
            if let Some(c) = m.checked_mul(f)
                && c >= v
            {
                return c;
            }
        }
        match m.checked_mul(10) {
            Some(n) => m = n,
            None => return u64::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> PolicyForm {
        PolicyForm {
            name: "search".into(),
            dimensions: "api_key,endpoint".into(),
            capacity: "100".into(),
            period: "1m".into(),
            refill: "".into(),
            cost: "".into(),
            failure_mode: "fail_closed".into(),
            local_share_percent: "".into(),
            max_in_flight: "".into(),
            algorithm: "".into(),
            shadow: false,
        }
    }

    #[test]
    fn a_valid_form_becomes_the_spec_the_edge_parses() {
        let spec = form().to_spec().unwrap();
        assert_eq!(spec.quota.capacity, 100);
        assert_eq!(spec.cost, 1);
        assert_eq!(PolicyForm::from_spec(&spec).to_spec().unwrap(), spec);
        let mut f = form();
        f.failure_mode = "local_fallback".into();
        f.local_share_percent = "10".into();
        f.max_in_flight = "20".into();
        let spec = f.to_spec().unwrap();
        assert_eq!(
            (spec.local_share_percent, spec.max_in_flight),
            (Some(10), Some(20))
        );
        f.cost = "1".into();
        f.algorithm = "token_bucket".into();
        assert_eq!(PolicyForm::from_spec(&spec), f);
        let mut f = form();
        f.algorithm = "fixed_window".into();
        f.shadow = true;
        let spec = f.to_spec().unwrap();
        assert!(spec.shadow);
        assert_eq!(
            spec.algorithm,
            floodgate_shared::policy::Algorithm::FixedWindow
        );
    }

    #[test]
    fn each_bad_field_is_named_as_the_edge_names_it() {
        type Edit = fn(&mut PolicyForm);
        let cases: [(Edit, &str); 16] = [
            (|f| f.algorithm = "leaky".into(), "algorithm"),
            (
                |f| {
                    f.algorithm = "sliding_log".into();
                    f.capacity = "20000".into()
                },
                "quota.capacity",
            ),
            (|f| f.max_in_flight = "0".into(), "max_in_flight"),
            (
                |f| {
                    f.failure_mode = "local_fallback".into();
                    f.local_share_percent = "101".into()
                },
                "local_share_percent",
            ),
            (|f| f.capacity = "abc".into(), "quota.capacity"),
            (|f| f.capacity = "".into(), "quota.capacity"),
            (|f| f.capacity = "0".into(), "quota.capacity"),
            (|f| f.capacity = "-5".into(), "quota.capacity"),
            (|f| f.capacity = "1.5".into(), "quota.capacity"),
            (
                |f| f.capacity = "99999999999999999999999".into(),
                "quota.capacity",
            ),
            (|f| f.period = "1 fortnight".into(), "quota.period"),
            (|f| f.refill = "1e3".into(), "quota.refill"),
            (|f| f.cost = "x".into(), "cost"),
            (|f| f.name = "<script>".into(), "name"),
            (|f| f.dimensions = "api_key,planet".into(), "dimensions[1]"),
            (|f| f.failure_mode = "maybe".into(), "failure_mode"),
        ];
        for (edit, field) in cases {
            let mut f = form();
            edit(&mut f);
            let e = f.to_spec().unwrap_err();
            assert_eq!(e.field, field, "{f:?} → {e}");
        }
        let e = PolicyError::new("dimensions[1]", "unknown");
        assert_eq!(
            Saved::invalid(e).message_for("dimensions"),
            Some("unknown".into())
        );
        let e = PolicyError::new("plans.a[0]", "no policy");
        assert!(matches!(Saved::invalid(e), Saved::Invalid { field, .. } if field == "plans.a"));
        let mut f = form();
        f.name = "x".repeat(1 << 20);
        assert!(f.to_spec().unwrap_err().message.contains("longer than"));
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

    #[test]
    fn chart_geometry_stays_inside_the_box() {
        let pts = polyline(&[Some(0), Some(50), None, Some(1_000)], 100);
        let coords: Vec<(f64, f64)> = pts
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert_eq!(coords.len(), 4);
        assert_eq!(coords[0], (0.0, CHART_H));
        assert_eq!(coords[1].1, CHART_H / 2.0);
        assert_eq!(coords[3], (CHART_W, 0.0), "clipped at the top");
        assert_eq!(level(5_000, 10_000), CHART_H / 2.0);
        assert_eq!(nice_max(0), 1);
        assert_eq!(nice_max(7), 10);
        assert_eq!(nice_max(101), 200);
        assert_eq!(nice_max(u64::MAX), u64::MAX);
    }
}
