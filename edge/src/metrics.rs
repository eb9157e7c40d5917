//! Prometheus metrics (the `prometheus-client` crate, OpenMetrics text format).
//!
//! [`StatsMetrics`] turns the stats fields the edges count ([`StatsField`], the
//! contract with the dashboard) into series: the native edge feeds it every count
//! as it happens ([`StatsSink`]), the dashboard feeds it what all edges wrote to
//! Redis (`floodgate_fleet_*`). [`EdgeMetrics`] adds what only a running instance
//! knows: its breakers, caches, degraded totals and upstream latency. The series
//! are listed in `docs/metrics.md`.
//!
//! Label values are bounded: routes and policies are names from the configuration
//! (at most [`MAX_LABEL_VALUES`] of each, the rest counted as `(other)`), never
//! API keys or paths; traffic that matched no route is `route="(unmatched)"`
//! (parentheses: no route name has them).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::stats::{Endpoint, LATENCY_BOUNDS_US, Leasing, StatsField};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::breaker::Phase;
use crate::pipeline::{Health, StoreRole};
use crate::stats::StatsSink;
use crate::sync::lock;

/// The most distinct routes (and, separately, policies) given their own label
/// value; more are counted as `(other)`.
pub const MAX_LABEL_VALUES: usize = 100;
/// The label value of traffic that matched no route.
pub const UNMATCHED: &str = "(unmatched)";
/// The label value of routes or policies beyond [`MAX_LABEL_VALUES`].
pub const OTHER: &str = "(other)";
/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    route: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyDecisionLabels {
    policy: String,
    route: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    route: String,
    mode: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FleetModeLabels {
    mode: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenyLabels {
    list: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    policy: String,
    path: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

/// Bounded label values: the first [`MAX_LABEL_VALUES`] names seen keep theirs.
#[derive(Debug, Default)]
struct Names(Mutex<BTreeSet<String>>);

impl Names {
    fn label(&self, name: &str) -> String {
        let mut seen = lock(&self.0);
        if seen.contains(name) || seen.len() < MAX_LABEL_VALUES && seen.insert(name.to_string()) {
            name.to_string()
        } else {
            OTHER.to_string()
        }
    }
}

/// Store-call latency as the edges count it: per bucket of
/// [`LATENCY_BOUNDS_US`] and summed; encoded as a histogram in seconds. Clones
/// share the counts (one in the registry, one fed).
#[derive(Debug, Default, Clone)]
pub struct LatencyBuckets(std::sync::Arc<Buckets>);

#[derive(Debug, Default)]
pub struct Buckets {
    counts: [AtomicU64; LATENCY_BOUNDS_US.len()],
    sum_us: AtomicU64,
}

impl LatencyBuckets {
    fn add_bucket(&self, bound: u64, n: u64) {
        if let Some(i) = LATENCY_BOUNDS_US.iter().position(|b| *b == bound) {
            self.0.counts[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    fn add_sum(&self, us: u64) {
        self.0.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

impl TypedMetric for LatencyBuckets {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyBuckets {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_US
            .iter()
            .zip(&self.0.counts)
            .map(|(b, c)| {
                let bound = if *b == u64::MAX {
                    f64::MAX
                } else {
                    *b as f64 / 1e6
                };
                (bound, c.load(Ordering::Relaxed))
            })
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = self.0.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The series of the stats fields (see the module's documentation).
#[derive(Debug, Default)]
pub struct StatsMetrics {
    decisions: Family<DecisionLabels, Counter>,
    policy_decisions: Family<PolicyDecisionLabels, Counter>,
    degraded: Family<ModeLabels, Counter>,
    degraded_by_mode: Family<FleetModeLabels, Counter>,
    denied: Family<DenyLabels, Counter>,
    store_latency: LatencyBuckets,
    breaker_opened: Counter,
    breaker_open_seconds: Counter<f64, AtomicU64>,
    sample_dropped: Counter,
    leased: Family<LeaseLabels, Counter>,
    refills: Family<PolicyLabels, Counter>,
    outstanding: Family<PolicyLabels, Counter>,
    routes: Names,
    policies: Names,
}

impl StatsMetrics {
    /// The series, registered in `registry` (whose prefix names them:
    /// `floodgate_` on an edge, `floodgate_fleet_` on the dashboard).
    pub fn register(registry: &mut Registry) -> std::sync::Arc<Self> {
        let m = std::sync::Arc::new(Self::default());
        registry.register(
            "decisions",
            "Requests decided, by route and outcome (allowed, throttled, degraded: decided without the store; shadow_throttled: admitted, a shadow policy would have throttled)",
            m.decisions.clone(),
        );
        registry.register(
            "policy_decisions",
            "Requests decided, by policy, route and outcome as the policy saw it (allowed; throttled: this policy denied; shadow_throttled; degraded_<mode>: decided without the store under that failure mode)",
            m.policy_decisions.clone(),
        );
        registry.register(
            "degraded_decisions",
            "Requests decided without the store, by route and the failure mode applied",
            m.degraded.clone(),
        );
        registry.register(
            "degraded_by_mode",
            "Requests decided without the store, by failure mode",
            m.degraded_by_mode.clone(),
        );
        registry.register_with_unit(
            "store_latency",
            "Latency of the bucket check's store call",
            Unit::Seconds,
            m.store_latency.clone(),
        );
        registry.register(
            "breaker_opened",
            "Circuit breaker transitions from closed to open (new outages)",
            m.breaker_opened.clone(),
        );
        registry.register_with_unit(
            "breaker_open",
            "Time the circuit breaker spent open or half-open",
            Unit::Seconds,
            m.breaker_open_seconds.clone(),
        );
        registry.register(
            "denied",
            "Requests refused by a deny list (403, no quota spent), by list (key_id, ip, country, user_agent)",
            m.denied.clone(),
        );
        registry.register(
            "sample_dropped",
            "Decisions left out of the dashboard's sample (queue full between flushes)",
            m.sample_dropped.clone(),
        );
        registry.register(
            "lease_decisions",
            "Requests of bounded and auto policies, by policy and path (local: from leased tokens, exact: the global store)",
            m.leased.clone(),
        );
        registry.register(
            "lease_refills",
            "Global store calls that refilled a lease or a regional pool, by policy",
            m.refills.clone(),
        );
        registry.register(
            "lease_outstanding_tokens",
            "Tokens outstanding on the policy's leases as each refill found them, summed (divided by lease_refills: the mean)",
            m.outstanding.clone(),
        );
        m
    }

    fn route(&self, e: &Endpoint) -> String {
        match e.route() {
            Some(r) => self.routes.label(r),
            None => UNMATCHED.to_string(),
        }
    }
}

impl StatsSink for StatsMetrics {
    fn add(&self, field: &StatsField, n: u64) {
        match field {
            StatsField::Endpoint(e, counted) => {
                self.decisions
                    .get_or_create(&DecisionLabels {
                        route: self.route(e),
                        outcome: counted.name(),
                    })
                    .inc_by(n);
            }
            StatsField::EndpointMode(e, m) => {
                self.degraded
                    .get_or_create(&ModeLabels {
                        route: self.route(e),
                        mode: m.name(),
                    })
                    .inc_by(n);
            }
            StatsField::Mode(m) => {
                self.degraded_by_mode
                    .get_or_create(&FleetModeLabels { mode: m.name() })
                    .inc_by(n);
            }
            StatsField::Latency(bound) => self.store_latency.add_bucket(*bound, n),
            StatsField::LatencySumUs => self.store_latency.add_sum(n),
            StatsField::BreakerOpened => {
                self.breaker_opened.inc_by(n);
            }
            StatsField::BreakerOpenMs => {
                self.breaker_open_seconds.inc_by(n as f64 / 1e3);
            }
            StatsField::SampleDropped => {
                self.sample_dropped.inc_by(n);
            }
            StatsField::Denied(list) => {
                self.denied
                    .get_or_create(&DenyLabels {
                        list: list.name().to_string(),
                    })
                    .inc_by(n);
            }
            StatsField::PolicyDecision(policy, e, outcome) => {
                self.policy_decisions
                    .get_or_create(&PolicyDecisionLabels {
                        policy: self.policies.label(policy),
                        route: self.route(e),
                        outcome: outcome.name(),
                    })
                    .inc_by(n);
            }
            StatsField::Leasing(policy, how) => {
                let policy = self.policies.label(policy);
                let _ = match how {
                    Leasing::Local | Leasing::Exact => self
                        .leased
                        .get_or_create(&LeaseLabels {
                            policy,
                            path: how.name().to_string(),
                        })
                        .inc_by(n),
                    Leasing::Refills => self
                        .refills
                        .get_or_create(&PolicyLabels { policy })
                        .inc_by(n),
                    Leasing::Outstanding => self
                        .outstanding
                        .get_or_create(&PolicyLabels { policy })
                        .inc_by(n),
                };
            }
        }
    }
}

/// The registry's series in the OpenMetrics text format, `extra` (per-scrape
/// registries) after them, and the closing `# EOF`.
pub fn render(registries: &[&Registry]) -> String {
    let mut out = String::new();
    for r in registries {
        // writing to a String cannot fail
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, r);
    }
    let _ = prometheus_client::encoding::text::encode_eof(&mut out);
    out
}

/// The upstream latency histogram's bucket bounds (seconds).
pub const UPSTREAM_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A native edge's metrics: the stats series, its upstream latency, and what its
/// pipeline reports at each scrape ([`EdgeMetrics::scrape`]).
#[derive(Debug)]
pub struct EdgeMetrics {
    registry: Registry,
    pub stats: std::sync::Arc<StatsMetrics>,
    /// Time to the upstream's response head, by answer (a status class, or
    /// `error` / `timeout`).
    upstream: Family<UpstreamLabels, Histogram>,
    /// Each answer's series, found in `upstream` at its first use (then observed
    /// without a lookup: one per request).
    by_answer: [std::sync::OnceLock<Histogram>; UPSTREAM_ANSWERS.len()],
}

/// The label of each kind of upstream answer, in [`UpstreamAnswer::index`]'s order.
const UPSTREAM_ANSWERS: [&str; 7] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error", "timeout"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    status: &'static str,
}

/// What the upstream answered, for [`EdgeMetrics::upstream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamAnswer {
    Status(u16),
    Error,
    Timeout,
}

impl UpstreamAnswer {
    /// Its place in [`UPSTREAM_ANSWERS`].
    fn index(self) -> usize {
        match self {
            UpstreamAnswer::Status(s) => usize::from((s / 100).clamp(1, 5)) - 1,
            UpstreamAnswer::Error => 5,
            UpstreamAnswer::Timeout => 6,
        }
    }
}

impl Default for EdgeMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("floodgate");
        let stats = StatsMetrics::register(&mut registry);
        let upstream = Family::<UpstreamLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(UPSTREAM_BUCKETS)
        });
        registry.register_with_unit(
            "upstream_latency",
            "Time from sending a request upstream to its response head, by status class (2xx..5xx, error, timeout)",
            Unit::Seconds,
            upstream.clone(),
        );
        Self {
            registry,
            stats,
            upstream,
            by_answer: Default::default(),
        }
    }
}

impl EdgeMetrics {
    /// Records one upstream exchange.
    pub fn upstream(&self, answer: UpstreamAnswer, seconds: f64) {
        let i = answer.index();
        self.by_answer[i]
            .get_or_init(|| {
                let labels = UpstreamLabels {
                    status: UPSTREAM_ANSWERS[i],
                };
                self.upstream.get_or_create(&labels).clone()
            })
            .observe(seconds);
    }

    /// The scrape's text: the counted series, then the instance's state now.
    pub fn scrape(&self, now: &InstanceState) -> String {
        let mut state = Registry::with_prefix("floodgate");
        now.register(&mut state);
        render(&[&self.registry, &state])
    }
}

/// What a native edge reports at each scrape.
#[derive(Debug, Clone)]
pub struct InstanceState {
    pub health: Health,
    pub breakers: Vec<(StoreRole, Phase, crate::breaker::BreakerStats)>,
    /// Key records found fresh in the cache, and key lookups sent to the store.
    pub key_cache: (u64, u64),
    /// `false`: the limiter is off (`--no-limit`).
    pub limiter: bool,
    /// Waves of store calls polled through until back, polled for the budget in
    /// vain, slept through (`native_host::idle_poll`).
    pub idle_poll: [u64; 3],
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    store: &'static str,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    store: &'static str,
    to: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExpiryLabels {
    store: &'static str,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    result: &'static str,
}

impl InstanceState {
    fn register(&self, r: &mut Registry) {
        self.register_breakers(r);
        self.register_totals(r);
        self.register_deadlines(r);
        r.register(
            "limiter_enabled",
            "0 when the instance proxies without limiting (--no-limit)",
            ConstGauge::new(i64::from(self.limiter)),
        );
        let [back, silent, asleep] = self.idle_poll;
        r.register(
            "idle_poll_waves",
            "Waves of store calls (from a first call out to none) by how the host waited: back (polled until every reply came), silent (polled for the budget, no reply, then slept), asleep (slept through, backing off)",
            Snapshot::counters(vec![
                (OutcomeLabels { outcome: "back" }, back),
                (OutcomeLabels { outcome: "silent" }, silent),
                (OutcomeLabels { outcome: "asleep" }, asleep),
            ]),
        );
    }

    /// Each store's breaker: its state, and its transitions.
    fn register_breakers(&self, r: &mut Registry) {
        let mut states = vec![];
        let mut transitions = vec![];
        for (store, phase, stats) in &self.breakers {
            for p in [Phase::Closed, Phase::Open, Phase::HalfOpen] {
                states.push((
                    BreakerLabels {
                        store: store.name(),
                        state: p.name(),
                    },
                    i64::from(*phase == p),
                ));
            }
            for (to, n) in [
                ("open", stats.opened),
                ("closed", stats.closed),
                ("half_open", stats.probes),
            ] {
                transitions.push((
                    TransitionLabels {
                        store: store.name(),
                        to,
                    },
                    n,
                ));
            }
        }
        r.register(
            "breaker_state",
            "1 for each store's circuit breaker's current state (closed, open, half_open)",
            Snapshot::gauges(states),
        );
        r.register(
            "breaker_transitions",
            "Circuit breaker transitions by store and the state entered",
            Snapshot::counters(transitions),
        );
    }

    /// The degraded totals, unknown keys, late calls, refunds, leases, key cache.
    fn register_totals(&self, r: &mut Registry) {
        let h = &self.health;
        let counters: [(&str, &str, u64); 9] = [
            (
                "degraded_fail_open",
                "Requests forwarded without the store (fail-open)",
                h.fail_open,
            ),
            (
                "degraded_fail_closed",
                "Requests refused because the store was unreachable (fail-closed)",
                h.fail_closed,
            ),
            (
                "degraded_local_fallback",
                "Requests decided by this instance's local buckets while the store was unreachable",
                h.local_fallback,
            ),
            (
                "unknown_key_lookups",
                "Key lookups that found no key",
                h.unknown_key_lookups,
            ),
            (
                "unknown_key_refused",
                "Uncached keys refused without a lookup (the unknown-key budget was spent)",
                h.unknown_key_refused,
            ),
            (
                "late_store_calls",
                "Store calls that missed their answer deadline",
                h.late_calls,
            ),
            (
                "refunds",
                "Late admissions given back because their request had been refused",
                h.refunds,
            ),
            (
                "leased_while_global_down",
                "Requests decided from leased tokens while the global store was down",
                h.leased_while_down,
            ),
            (
                "lease_misses",
                "Leased requests whose tokens were not at hand (decided exactly)",
                h.lease_misses,
            ),
        ];
        for (name, help, v) in counters {
            r.register(name, help, ConstCounter::new(v));
        }
        let (hits, misses) = self.key_cache;
        r.register(
            "key_cache_lookups",
            "API key records looked up, by result (hit: fresh in the cache, miss: read from the store)",
            Snapshot::counters(vec![
                (CacheLabels { result: "hit" }, hits),
                (CacheLabels { result: "miss" }, misses),
            ]),
        );
    }

    /// Each store's adaptive deadline (issue 17), and why calls missed it.
    fn register_deadlines(&self, r: &mut Registry) {
        let h = &self.health;
        let lanes: Vec<(&'static str, &crate::pipeline::lane::DeadlineStats)> =
            std::iter::once(("global", &h.global))
                .chain(h.regional.as_ref().map(|d| ("regional", d)))
                .collect();
        r.register_with_unit(
            "store_deadline",
            "The answer deadline a store call sent now gets (adaptive within its floor and ceiling, or pinned), by store",
            Unit::Seconds,
            GaugesF64(
                lanes
                    .iter()
                    .map(|(store, d)| (StoreLabels { store }, d.deadline_us as f64 / 1e6))
                    .collect(),
            ),
        );
        r.register(
            "store_deadline_expired",
            "Store calls that missed their deadline, by store and kind (slow: replies kept arriving, not a breaker failure; silent: nothing arrived since the send, a breaker failure)",
            Snapshot::counters(
                lanes
                    .iter()
                    .flat_map(|(store, d)| {
                        [
                            (ExpiryLabels { store, kind: "slow" }, d.slow),
                            (ExpiryLabels { store, kind: "silent" }, d.silent),
                        ]
                    })
                    .collect(),
            ),
        );
        r.register(
            "store_late_replies",
            "Replies that came after their call's deadline but within the ceiling (each raises the deadline), by store",
            Snapshot::counters(
                lanes
                    .iter()
                    .map(|(store, d)| (StoreLabels { store }, d.late_replies))
                    .collect(),
            ),
        );
    }
}

/// Gauges with fractional values by label set, fixed at scrape time.
#[derive(Debug)]
struct GaugesF64<L>(Vec<(L, f64)>);

impl<L> TypedMetric for GaugesF64<L> {
    const TYPE: MetricType = MetricType::Gauge;
}

impl<L: EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> EncodeMetric for GaugesF64<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, v) in &self.0 {
            encoder.encode_family(labels)?.encode_gauge(v)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Labelled values fixed at scrape time (gauges or counters).
#[derive(Debug)]
struct Snapshot<L> {
    counter: bool,
    values: Vec<(L, i64)>,
}

impl<L> Snapshot<L> {
    fn gauges(values: Vec<(L, i64)>) -> Self {
        Self {
            counter: false,
            values,
        }
    }

    fn counters(values: Vec<(L, u64)>) -> Self {
        Self {
            counter: true,
            values: values
                .into_iter()
                .map(|(l, v)| (l, i64::try_from(v).unwrap_or(i64::MAX)))
                .collect(),
        }
    }
}

impl<L: EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> EncodeMetric for Snapshot<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, v) in &self.values {
            let mut e = encoder.encode_family(labels)?;
            if self.counter {
                e.encode_counter::<NoLabelSet, _, u64>(&(*v as u64), None)?;
            } else {
                e.encode_gauge(v)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        if self.counter {
            MetricType::Counter
        } else {
            MetricType::Gauge
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::policy::FailureMode;
    use floodgate_shared::stats::{Counted, Outcome, PolicyOutcome};

    #[test]
    fn stats_fields_become_labelled_series() {
        let mut r = Registry::with_prefix("floodgate");
        let m = StatsMetrics::register(&mut r);
        let api = Endpoint::Route("api".into());
        m.add(
            &StatsField::Endpoint(api.clone(), Counted::Outcome(Outcome::Allowed)),
            3,
        );
        m.add(
            &StatsField::Endpoint(Endpoint::Unmatched, Counted::Outcome(Outcome::Throttled)),
            1,
        );
        m.add(&StatsField::EndpointMode(api, FailureMode::FailOpen), 2);
        m.add(&StatsField::Latency(500), 2);
        m.add(&StatsField::Latency(u64::MAX), 1);
        m.add(&StatsField::LatencySumUs, 2_000_700);
        m.add(&StatsField::Leasing("burst".into(), Leasing::Local), 4);
        m.add(
            &StatsField::PolicyDecision(
                "search".into(),
                Endpoint::Route("api".into()),
                PolicyOutcome::Throttled,
            ),
            5,
        );
        m.add(
            &StatsField::PolicyDecision(
                "search".into(),
                Endpoint::Unmatched,
                PolicyOutcome::Degraded(FailureMode::LocalFallback),
            ),
            6,
        );
        let text = render(&[&r]);
        for line in [
            r#"floodgate_decisions_total{route="api",outcome="allowed"} 3"#,
            r#"floodgate_decisions_total{route="(unmatched)",outcome="throttled"} 1"#,
            r#"floodgate_degraded_decisions_total{route="api",mode="fail_open"} 2"#,
            r#"floodgate_store_latency_seconds_bucket{le="0.00025"} 0"#,
            r#"floodgate_store_latency_seconds_bucket{le="0.0005"} 2"#,
            r#"floodgate_store_latency_seconds_bucket{le="1.0"} 2"#,
            r#"floodgate_store_latency_seconds_bucket{le="+Inf"} 3"#,
            "floodgate_store_latency_seconds_count 3",
            "floodgate_store_latency_seconds_sum 2.0007",
            r#"floodgate_lease_decisions_total{policy="burst",path="local"} 4"#,
            r#"floodgate_policy_decisions_total{policy="search",route="api",outcome="throttled"} 5"#,
            r#"floodgate_policy_decisions_total{policy="search",route="(unmatched)",outcome="degraded_local_fallback"} 6"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn label_values_are_bounded() {
        let names = Names::default();
        for i in 0..MAX_LABEL_VALUES {
            assert_eq!(names.label(&format!("r{i}")), format!("r{i}"));
        }
        assert_eq!(names.label("one-more"), OTHER);
        assert_eq!(names.label("r0"), "r0");
    }
}
