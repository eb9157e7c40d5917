//! The edge's request pipeline, free of any host: authenticate the API key, resolve
//! the policies that apply, check them all in ONE store round trip, and tell the
//! host what to do — answer directly (401/403/429/503) or forward upstream with
//! the quota headers — plus the work to finish after answering (background tasks:
//! refunds, late replies). The Worker and the native host are thin adapters
//! around it; what both do with the HTTP exchange itself is [`crate::proxy`].
//!
//! A request goes through phases, each returning early with its answer:
//! credentials → caller (key record and configuration, cached) → deny lists → policies →
//! deny cache → the bucket check → in-flight slots → forward.
//!
//! Every store call (key and configuration reads included) goes through the
//! circuit breaker and has an answer deadline ([`PipelineConfig::deadline`]): a
//! request never waits longer than that for one call, and a call that misses it
//! keeps running in the background. Redis itself refuses a bucket check it runs
//! after the instance stopped waiting (the instant is passed in Redis' clock, see
//! [`offset`]), and a late reply that admitted a request the client was refused is
//! refunded, so a refused request costs no quota.
//!
//! Configuration and key records are cached in memory for a short TTL (unknown
//! keys longer), so a warm request costs one round trip in total (the bucket
//! check). A revoked key stops working within that TTL.

mod answer;
pub mod bounded;
mod deny;
pub mod events;
pub mod lane;
pub mod offset;
mod records;

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use floodgate_shared::apikeys::{
    KeyProblem, KeyRecord, KeyStatus, hash_secret, key_from_header, record_key,
};
use floodgate_shared::config::{CONFIG_KEY, EdgeConfig};
use floodgate_shared::contract::{Answer, PolicyState, RateLimitHeaders, ietf_fields, jittered};
use floodgate_shared::deny::Visitor;
use floodgate_shared::lease::{
    LeaseConfig, POOL_ADD, POOL_TAKE, PoolAsk, PoolTaken, pool_keys, pool_take_args,
};
use floodgate_shared::policy::{Consistency, FailureMode, Policy, Quota};
use floodgate_shared::routes::Route;
use floodgate_shared::script::{Check, Verdict, When};
use floodgate_shared::time::{Clock, MICROS_PER_SEC, Micros, ceil_secs};

pub use self::answer::{DEGRADED_HEADER, Gate, Slot};
use self::bounded::{GiveBack, LeaseSettings, Leases, Refill};
use self::deny::{Denied, DenyCache};
pub use self::events::{LogEvent, StoreRole};
use self::lane::{DeadlineStats, Lane};
use self::offset::OffsetBound;
use self::records::{Lookup, Records, UnknownKeyBudget};
use crate::breaker::{Breaker, BreakerStats, Permit, Phase, Transition};
use crate::deadline::DeadlineSettings;
use crate::fallback::LocalBuckets;
use crate::stats::{Leasing, Outcome, Stats, StatsField};
use crate::store::{MaybeSend, MaybeSync, Store, StoreError, StoreErrorKind};
use crate::sync::lock;
use crate::timer::{Raced, Stopwatch, race};
use floodgate_shared::stats::{Endpoint, PolicyOutcome};

/// A pool chunk dies this long before its global lease, for clocks that read in
/// whole milliseconds (the Worker) and the hop to the regional store.
const POOL_MARGIN: Micros = 50_000;

/// What the pipeline needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The raw path, without the query.
    pub path: &'a str,
    /// The value of the credentials header, if any.
    pub credentials: Option<&'a [u8]>,
    pub client_ip: Option<IpAddr>,
    /// The client's country (ISO 3166-1 alpha-2), when the host knows it: the
    /// Worker's `request.cf.country`, the native host's `--country-header`.
    pub country: Option<&'a str>,
    /// The `User-Agent` header's value.
    pub user_agent: Option<&'a [u8]>,
}

/// A boxed future: `Send` natively (so a host can spawn it), not in wasm32.
#[cfg(not(target_arch = "wasm32"))]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// A boxed future: `Send` natively (so a host can spawn it), not in wasm32.
#[cfg(target_arch = "wasm32")]
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Work to finish after the answer: the native host spawns it, the Worker hands it
/// to `ctx.wait_until`.
pub type Task = BoxFuture<'static, ()>;

fn boxed<'a, T>(f: impl Future<Output = T> + MaybeSend + 'a) -> BoxFuture<'a, T> {
    Box::pin(f)
}

/// The pipeline's decision about one request.
pub struct Decided {
    pub gate: Gate,
    /// Tasks the host runs after answering (never on the request's path).
    pub background: Vec<Task>,
}

/// How the pipeline behaves.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// `true`: credentials are `Authorization: Bearer <key>`; `false`: the header
    /// holds the key itself (the host picks the header).
    pub bearer: bool,
    /// How long configuration and key records are cached (µs).
    pub cache_ttl: Micros,
    /// How long a key found not to exist is remembered as such (µs).
    pub negative_cache_ttl: Micros,
    /// Most key records cached at once (unknown keys included).
    pub max_cached_keys: usize,
    /// Answer a bucket that just denied locally until its Retry-After, without
    /// calling the store (see [`deny`]).
    pub deny_cache: bool,
    /// How long a request waits for one store call: adaptive within a floor and a
    /// ceiling, or fixed (see [`crate::deadline`]); then it gets its policies'
    /// failure mode, and the call goes on in the background. The regional store
    /// has its own, with these settings unless given others.
    pub deadline: DeadlineSettings,
    /// How long the first requests of an instance may wait for its first read of
    /// the configuration (µs), counted from the first one: a store slow to
    /// connect does not turn them into 503s.
    pub startup_wait: Micros,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_threshold: u32,
    /// How long the open breaker keeps requests off the store (µs), before it
    /// health-checks the store.
    pub breaker_cool_down: Micros,
    /// How long an in-flight slot lives unless released (µs): slots of a crashed
    /// instance free themselves then. Longer than the longest request.
    pub in_flight_ttl: Micros,
    /// Lookups that find no key, per client address per minute, before the edge
    /// refuses uncached keys from that address without a lookup (0: no limit).
    pub unknown_keys_per_ip_per_min: u32,
    /// The same budget for the whole instance (0: no limit).
    pub unknown_keys_per_min: u32,
    /// Lease lifetime and the `auto` switch's rates (bounded consistency).
    pub leases: LeaseSettings,
    /// Where breaker transitions and configuration reloads are logged: `tracing`
    /// natively ([`events::trace`]), JSON lines on the console in the Worker.
    pub log: fn(&LogEvent<'_>),
}

/// Default breaker threshold: consecutive retryable failures that open it.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// Default breaker cool-down before the health check (µs).
pub const DEFAULT_BREAKER_COOL_DOWN: Micros = MICROS_PER_SEC;
/// The floor of the answer deadline of a store call next to Redis (µs): see
/// `docs/failure.md` for the measurements behind it.
pub const DEFAULT_DEADLINE: Micros = DeadlineSettings::RESP.floor;
/// Default start-up wait for the first configuration read (µs).
pub const DEFAULT_STARTUP_WAIT: Micros = 2 * MICROS_PER_SEC;

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            bearer: true,
            cache_ttl: 5 * MICROS_PER_SEC,
            negative_cache_ttl: 60 * MICROS_PER_SEC,
            max_cached_keys: 100_000,
            deny_cache: true,
            deadline: DeadlineSettings::RESP,
            startup_wait: DEFAULT_STARTUP_WAIT,
            breaker_threshold: DEFAULT_BREAKER_THRESHOLD,
            breaker_cool_down: DEFAULT_BREAKER_COOL_DOWN,
            in_flight_ttl: 60 * MICROS_PER_SEC,
            unknown_keys_per_ip_per_min: 20,
            unknown_keys_per_min: 600,
            leases: LeaseSettings::default(),
            log: events::trace,
        }
    }
}

/// FNV-1a over `bytes` (never 0 in practice; tells one stored text from another).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How long a store call may run in the background after missing an answer
/// deadline of `deadline`: the store's own (transport) deadline, which hosts give
/// their stores. Long enough for a late reply to be settled (refunded), short
/// enough that an outage leaves few calls behind.
pub fn store_deadline(deadline: Duration) -> Duration {
    (deadline * 20).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// Running totals since the instance started, for alerting (see [`Health`]).
#[derive(Default)]
struct Totals {
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    local_fallback: AtomicU64,
    unknown_key_lookups: AtomicU64,
    unknown_key_refused: AtomicU64,
    late_calls: AtomicU64,
    refunds: AtomicU64,
    /// Requests decided from leased tokens while the global store was down.
    leased_while_down: AtomicU64,
    /// Leased requests whose tokens were not at hand (decided exactly instead).
    lease_misses: AtomicU64,
    /// µs of breaker time already written to `breaker|open_ms`.
    open_us_counted: std::sync::Mutex<Micros>,
    key_cache_hits: AtomicU64,
    key_cache_misses: AtomicU64,
    /// The FNV-1a digest of the configuration in use (0: none yet), so a reload
    /// of the same text is not logged as a new configuration.
    config_digest: AtomicU64,
    /// Why the stored configuration was last not used (logged once per reason).
    config_problem: std::sync::Mutex<String>,
}

/// One instance's view of its store, served as JSON by the hosts
/// (`GET /__floodgate/health`) for alerting on fail-open duration and volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub breaker: Phase,
    pub stats: BreakerStats,
    /// Requests answered without Redis, per failure mode, since start: every
    /// answer marked `X-RateLimit-Degraded` (and the 503s of an instance that
    /// could not read its configuration or a key).
    pub fail_open: u64,
    pub fail_closed: u64,
    pub local_fallback: u64,
    /// Key lookups that found no key, and uncached keys refused without a lookup
    /// because their address (or the instance) had spent its budget.
    pub unknown_key_lookups: u64,
    pub unknown_key_refused: u64,
    /// Store calls that missed their answer deadline, and late admissions given
    /// back because their request had been refused.
    pub late_calls: u64,
    pub refunds: u64,
    /// Requests decided from leased tokens (bounded consistency), those decided so
    /// while the global store was down (degraded but bounded), and leased requests
    /// whose tokens were not at hand (decided exactly).
    pub leased: u64,
    pub leased_while_down: u64,
    pub lease_misses: u64,
    /// The global store's deadlines (the current one, expiries slow and silent,
    /// late replies), and the regional store's.
    pub global: DeadlineStats,
    pub regional: Option<DeadlineStats>,
}

impl Health {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "breaker": self.breaker.name(),
            "breaker_opened": self.stats.opened,
            "breaker_closed": self.stats.closed,
            "breaker_probes": self.stats.probes,
            "breaker_skipped": self.stats.skipped,
            "degraded_seconds": self.stats.degraded_us as f64 / 1e6,
            "degraded_requests": {
                "fail_open": self.fail_open,
                "fail_closed": self.fail_closed,
                "local_fallback": self.local_fallback,
            },
            "unknown_keys": {
                "lookups": self.unknown_key_lookups,
                "refused": self.unknown_key_refused,
            },
            "late_calls": self.late_calls,
            "refunds": self.refunds,
            "leased": {
                "decisions": self.leased,
                "while_global_down": self.leased_while_down,
                "misses": self.lease_misses,
            },
            "deadline_ms": self.global.deadline_us as f64 / 1e3,
            "deadlines": {
                "global": self.global.to_json(),
                "regional": self.regional.as_ref().map(DeadlineStats::to_json),
            },
        })
        .to_string()
    }
}

/// The mode applied when several policies match: fail_closed over local_fallback
/// over fail_open.
pub fn strictest(modes: impl Iterator<Item = FailureMode>) -> FailureMode {
    FailureMode::strictest(modes)
}

/// A store call's fate under the breaker and the answer deadline.
enum Called<T> {
    Done(T),
    /// Refused, skipped (breaker open) or late; a late call is still running.
    Failed(
        StoreError,
        Option<BoxFuture<'static, Result<T, StoreError>>>,
    ),
}

/// A request's checks, owned: a bucket check that misses its deadline goes on
/// in the background with them.
struct OwnedCheck {
    key: String,
    quota: Quota,
    cost: u32,
    shadow: bool,
}

fn as_checks(owned: &[OwnedCheck]) -> Vec<Check<'_>> {
    owned
        .iter()
        .map(|c| Check {
            key: &c.key,
            quota: &c.quota,
            cost: c.cost,
            shadow: c.shadow,
        })
        .collect()
}

/// An authenticated request's context.
struct Ctx<'c> {
    config: &'c EdgeConfig,
    record: KeyRecord,
    route: Option<&'c Route>,
    /// `(bucket key, policy)` per matching policy.
    policies: Vec<(String, &'c Policy)>,
    started: Micros,
}

impl Ctx<'_> {
    fn route_name(&self) -> Option<&str> {
        self.route.map(|r| r.name.as_str())
    }

    fn enforced(&self) -> impl Iterator<Item = &(String, &Policy)> {
        self.policies.iter().filter(|(_, p)| !p.shadow())
    }

    fn mode(&self) -> FailureMode {
        FailureMode::strictest(self.enforced().map(|(_, p)| p.failure_mode()))
    }
}

/// The pipeline over a store `S` (RESP, REST or Cluster) and a clock `C`.
pub struct Pipeline<S, C> {
    store: S,
    clock: C,
    settings: PipelineConfig,
    records: Arc<Records>,
    unknown_keys: UnknownKeyBudget,
    stats: Stats,
    denied: DenyCache,
    /// The global store's breaker and deadline.
    global: Arc<Lane>,
    /// The first instant a request needed the configuration.
    first_read: std::sync::Mutex<Option<Micros>>,
    local: LocalBuckets,
    totals: Arc<Totals>,
    offset: OffsetBound,
    slot_ids: SlotIds,
    leases: Arc<Leases>,
    regional: Option<Regional<S>>,
}

/// A regional store holding the region's pools of leased tokens, behind its own
/// breaker (a regional outage sends bounded requests to the exact path).
struct Regional<S> {
    store: S,
    lane: Arc<Lane>,
}

/// Unique slot ids: a per-instance random prefix and a counter.
struct SlotIds {
    prefix: String,
    next: AtomicU64,
}

impl SlotIds {
    fn new(now: Micros) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_i64(now);
        Self {
            prefix: format!("{:016x}", h.finish()),
            next: AtomicU64::new(0),
        }
    }
    fn next(&self) -> String {
        format!(
            "{}-{:x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields for every enforced policy of
/// the request, when the configuration asks for them.
fn ietf(
    config: &EdgeConfig,
    policies: &[(String, &Policy)],
    verdict: &Verdict,
) -> Vec<(&'static str, String)> {
    if !config.headers().ietf {
        return vec![];
    }
    let states: Vec<PolicyState<'_>> = policies
        .iter()
        .zip(&verdict.decisions)
        .filter(|((_, p), _)| !p.shadow())
        .map(|((_, p), d)| PolicyState {
            name: p.name(),
            quota: p.quota(),
            decision: d,
        })
        .collect();
    ietf_fields(&states).map(Vec::from).unwrap_or_default()
}

/// The seed of a client's Retry-After jitter: its key and the instant.
fn jitter_seed(key_id: &str, now: Micros) -> u64 {
    key_id
        .bytes()
        .fold(now as u64, |h, b| h.rotate_left(5) ^ u64::from(b))
}

fn late_error(limit: Duration) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("no reply within {limit:?}"),
    )
}

/// Awaits a late call only to let its reply teach the deadline.
fn drain<T: 'static>(late: BoxFuture<'static, Result<T, StoreError>>) -> Task {
    boxed(async move {
        let _ = late.await;
    })
}

/// Parses a configuration just read and caches it, logging a change (or why it
/// was rejected, once per reason): the configuration, or why there is none.
fn load_config(
    records: &Records,
    totals: &Totals,
    log: fn(&LogEvent<'_>),
    raw: Option<Vec<u8>>,
    now: Micros,
) -> Result<Arc<EdgeConfig>, String> {
    let digest = raw.as_deref().map(fnv1a).unwrap_or_default();
    let parsed = raw
        .ok_or_else(|| "no configuration is stored (floodgate-cli config set)".to_string())
        .and_then(|raw| {
            let text = std::str::from_utf8(&raw)
                .map_err(|_| "the stored configuration is not UTF-8".to_string())?;
            EdgeConfig::from_json(text)
                .map_err(|e| format!("the stored configuration is invalid: {e}"))
        });
    match parsed {
        Ok(c) => {
            lock(&totals.config_problem).clear();
            if totals.config_digest.swap(digest, Ordering::Relaxed) != digest {
                let spec = c.spec();
                log(&LogEvent::ConfigLoaded {
                    policies: spec.policies.len(),
                    plans: spec.plans.len(),
                    routes: spec.routes.len(),
                    at: now,
                });
            }
            let c = Arc::new(c);
            records.set_config(c.clone(), now);
            Ok(c)
        }
        Err(why) => {
            let mut last = lock(&totals.config_problem);
            if *last != why {
                log(&LogEvent::ConfigRejected { why: &why, at: now });
                last.clone_from(&why);
            }
            // the last good one stays, and is checked again in a TTL
            records.keep_config(now);
            Err(why)
        }
    }
}

/// What a read of the records fetches, in this order: the configuration, then
/// the key record of `hash`.
fn record_names(hash: &str, key: bool, config: bool) -> Vec<String> {
    let mut names = vec![];
    if config {
        names.push(CONFIG_KEY.to_string());
    }
    if key {
        names.push(record_key(hash));
    }
    names
}

/// Caches a key record just read (`None`: no such key, counted as an unknown-key
/// lookup): the record.
fn load_key(
    records: &Records,
    totals: &Totals,
    hash: String,
    raw: Option<Vec<u8>>,
    now: Micros,
) -> Option<KeyRecord> {
    let record = raw.and_then(|raw| KeyRecord::from_json(&raw));
    if record.is_none() {
        totals.unknown_key_lookups.fetch_add(1, Ordering::Relaxed);
    }
    records.set_key(hash, record.clone(), now);
    record
}

fn skipped() -> StoreError {
    StoreError::new(
        StoreErrorKind::Connect,
        "circuit breaker open: the store is not called",
    )
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    pub fn new(store: S, clock: C, settings: PipelineConfig) -> Self {
        let slot_ids = SlotIds::new(clock.now());
        let leases = Arc::new(Leases::new(settings.leases, clock.now()));
        Self {
            store,
            clock,
            records: Arc::new(Records::new(
                settings.cache_ttl,
                settings.negative_cache_ttl,
                settings.max_cached_keys,
            )),
            unknown_keys: UnknownKeyBudget::new(
                settings.unknown_keys_per_ip_per_min,
                settings.unknown_keys_per_min,
            ),
            stats: Stats::default(),
            denied: DenyCache::default(),
            local: LocalBuckets::default(),
            totals: Arc::default(),
            offset: OffsetBound::default(),
            slot_ids,
            leases,
            regional: None,
            global: Arc::new(Self::lane(&settings, settings.deadline)),
            first_read: std::sync::Mutex::new(None),
            settings,
        }
    }

    /// Decides bounded policies against the pools of a regional store (one regional
    /// round trip per request) instead of this instance's own leases.
    pub fn with_regional(self, store: S) -> Self {
        let deadline = self.settings.deadline;
        self.with_regional_within(store, deadline)
    }

    /// [`Pipeline::with_regional`], the regional store's deadline with its own
    /// settings (another server, maybe another protocol).
    pub fn with_regional_within(mut self, store: S, deadline: DeadlineSettings) -> Self {
        let lane = Arc::new(Self::lane(&self.settings, deadline));
        self.regional = Some(Regional { store, lane });
        self
    }

    fn lane(settings: &PipelineConfig, deadline: DeadlineSettings) -> Lane {
        let breaker = Breaker::new(settings.breaker_threshold, settings.breaker_cool_down);
        Lane::new(breaker, deadline)
    }

    /// Counts every stats field into `sink` as well (the instance's Prometheus
    /// metrics natively), as it is counted.
    pub fn with_stats_sink(mut self, sink: Arc<dyn crate::stats::StatsSink>) -> Self {
        self.stats = Stats::with_sink(sink);
        self
    }

    /// The phase and counters of each store's breaker: the global store's, and
    /// the regional store's when there is one.
    pub fn breakers(&self) -> Vec<(StoreRole, Phase, BreakerStats)> {
        let now = self.clock.now();
        let mut out = vec![(
            StoreRole::Global,
            self.global.breaker.phase(),
            self.global.breaker.stats(now),
        )];
        if let Some(r) = &self.regional {
            out.push((
                StoreRole::Regional,
                r.lane.breaker.phase(),
                r.lane.breaker.stats(now),
            ));
        }
        out
    }

    /// Key records found fresh in the cache, and key lookups that went to the
    /// store, since start.
    pub fn key_cache(&self) -> (u64, u64) {
        (
            self.totals.key_cache_hits.load(Ordering::Relaxed),
            self.totals.key_cache_misses.load(Ordering::Relaxed),
        )
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The circuit breaker's counters (transitions, requests kept off the store,
    /// time degraded), for alerting.
    pub fn breaker_stats(&self) -> BreakerStats {
        self.global.breaker.stats(self.clock.now())
    }

    pub fn breaker_phase(&self) -> Phase {
        self.global.breaker.phase()
    }

    /// What the global store's deadlines did, and the regional store's.
    pub fn deadline_stats(&self) -> (DeadlineStats, Option<DeadlineStats>) {
        let now = self.clock.now();
        let regional = self.regional.as_ref().map(|r| r.lane.stats(now));
        (self.global.stats(now), regional)
    }

    /// The breaker's phase and counters and the degraded totals, for alerting.
    pub fn health(&self) -> Health {
        let t = &self.totals;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (global, regional) = self.deadline_stats();
        Health {
            breaker: self.global.breaker.phase(),
            stats: self.breaker_stats(),
            fail_open: load(&t.fail_open),
            fail_closed: load(&t.fail_closed),
            local_fallback: load(&t.local_fallback),
            unknown_key_lookups: load(&t.unknown_key_lookups),
            unknown_key_refused: load(&t.unknown_key_refused),
            late_calls: load(&t.late_calls),
            refunds: load(&t.refunds),
            leased: self.leases.local.load(Ordering::Relaxed),
            leased_while_down: load(&t.leased_while_down),
            lease_misses: load(&t.lease_misses),
            global,
            regional,
        }
    }

    /// Logs a breaker transition, if there was one, and counts new outages.
    fn logged(&self, store: StoreRole, moved: Option<Transition>) {
        if let Some(t) = moved {
            (self.settings.log)(&LogEvent::Breaker {
                store,
                transition: &t,
            });
            if (t.from, t.to) == (Phase::Closed, Phase::Open) {
                self.stats.bump(t.at, StatsField::BreakerOpened, 1);
            }
        }
    }

    /// The last instant (Redis' clock) at which a call sent at `sent` with
    /// `deadline` is still awaited: the stale-call guard follows the deadline the
    /// call is raced against.
    fn until(&self, sent: Micros, deadline: Micros) -> When {
        self.offset
            .to_redis(sent + deadline)
            .map_or(When::Redis, When::RedisUntil)
    }

    /// [`Pipeline::call_within`] the lane's deadline for a call sent now.
    async fn call_to<T: 'static>(
        &self,
        lane: &Arc<Lane>,
        store: &S,
        fut: BoxFuture<'static, Result<T, StoreError>>,
    ) -> Called<T> {
        let deadline = lane.deadline(self.clock.now());
        self.call_within(lane, store, deadline, fut).await
    }

    /// Runs one call to `store` (the global store, or the regional one) under its
    /// lane's circuit breaker, waiting `deadline` µs at most. Open breaker: not
    /// called at all. Half-open: this request health-checks the store first. A
    /// call that misses the deadline is handed back still running; it counts as a
    /// breaker failure only when nothing came from the store since it was sent,
    /// and its reply, when it comes, teaches the lane's deadline (see [`lane`]).
    async fn call_within<T: 'static>(
        &self,
        lane: &Arc<Lane>,
        store: &S,
        deadline: Micros,
        fut: BoxFuture<'static, Result<T, StoreError>>,
    ) -> Called<T> {
        let limit = Duration::from_micros(deadline.max(1) as u64);
        let breaker = &lane.breaker;
        let role = if Arc::ptr_eq(lane, &self.global) {
            StoreRole::Global
        } else {
            StoreRole::Regional
        };
        let (permit, moved) = breaker.permit(self.clock.now());
        self.logged(role, moved);
        match permit {
            Permit::Skip => return Called::Failed(skipped(), None),
            Permit::Probe => {
                let store = store.clone();
                let ping = race(boxed(async move { store.ping().await }), limit).await;
                let failed = match ping {
                    Raced::Done(Ok(())) => None,
                    Raced::Done(Err(e)) => Some(e),
                    Raced::Late(_) => Some(late_error(limit)),
                };
                let now = self.clock.now();
                if let Some(e) = failed {
                    // any failed health check reopens, whatever the error
                    self.logged(role, breaker.probe_failed(now, &e));
                    return Called::Failed(e, None);
                }
                self.logged(role, breaker.probe_succeeded(now));
            }
            Permit::Call => {}
        }
        let mark = lane.mark();
        let sent = self.clock.now();
        let watch = Stopwatch::start();
        match race(fut, limit).await {
            Raced::Done(Ok(v)) => {
                let now = self.clock.now();
                lane.answered(watch.elapsed().as_micros() as Micros, now);
                self.logged(role, breaker.success(now));
                Called::Done(v)
            }
            Raced::Done(Err(e)) if e.kind == StoreErrorKind::Stale => {
                // the store answered: slow, not down (no breaker failure)
                let latency = watch.elapsed().as_micros() as Micros;
                lane.stale(latency, deadline, self.clock.now());
                Called::Failed(e, None)
            }
            Raced::Done(Err(e)) => {
                if e.is_retryable() {
                    self.logged(role, breaker.failure(self.clock.now(), &e));
                }
                Called::Failed(e, None)
            }
            Raced::Late(still) => {
                let e = late_error(limit);
                self.totals.late_calls.fetch_add(1, Ordering::Relaxed);
                if !lane.expired(mark) {
                    // silent since the send: the store may be down
                    self.logged(role, breaker.failure(self.clock.now(), &e));
                }
                let lane = lane.clone();
                let observed = boxed(async move {
                    let reply = still.await;
                    let latency = watch.elapsed().as_micros() as Micros;
                    // anything but a lost connection is the store answering
                    if !matches!(&reply, Err(e) if e.kind == StoreErrorKind::Connect) {
                        lane.late_reply(latency, sent + latency);
                    }
                    reply
                });
                Called::Failed(e, Some(observed))
            }
        }
    }

    /// Takes one in-flight slot per policy with `max_in_flight`; all or none.
    /// `Ok(Err(()))`: some limit is full.
    async fn take_slots(
        &self,
        ctx: &Ctx<'_>,
        later: &mut Vec<Task>,
    ) -> Result<Result<Vec<Slot>, ()>, StoreError> {
        let mut taken = vec![];
        for (key, p) in ctx.enforced() {
            let Some(limit) = p.max_in_flight() else {
                continue;
            };
            let slot = Slot {
                key: floodgate_shared::script::in_flight_key(key),
                id: self.slot_ids.next(),
            };
            let ttl_ms = (self.settings.in_flight_ttl / 1_000).max(1) as u64;
            let sent = self.clock.now();
            let deadline = self.global.deadline(sent);
            let until = match self.until(sent, deadline) {
                When::RedisUntil(t) => Some(t),
                _ => None,
            };
            let store = self.store.clone();
            let (k, id) = (slot.key.clone(), slot.id.clone());
            let fut = boxed(async move { store.acquire_slot(&k, &id, limit, ttl_ms, until).await });
            let called = self.call_within(&self.global, &self.store, deadline, fut);
            let outcome = match called.await {
                Called::Done(taken) => Ok(taken),
                Called::Failed(e, late) => {
                    if let Some(late) = late {
                        // taken after all? give it back
                        let store = self.store.clone();
                        let s = slot.clone();
                        later.push(boxed(async move {
                            if let Ok(true) = late.await {
                                let _ = store.release_slot(&s.key, &s.id).await;
                            }
                        }));
                    }
                    Err(e)
                }
            };
            match outcome {
                Ok(true) => taken.push(slot),
                Ok(false) => {
                    later.push(self.release_task(taken));
                    return Ok(Err(()));
                }
                Err(e) => {
                    later.push(self.release_task(taken));
                    return Err(e);
                }
            }
        }
        Ok(Ok(taken))
    }

    fn release_task(&self, slots: Vec<Slot>) -> Task {
        let store = self.store.clone();
        boxed(async move {
            for s in slots {
                let _ = store.release_slot(&s.key, &s.id).await;
            }
        })
    }

    /// Gives back in-flight slots (errors ignored: an unreleased slot expires).
    pub async fn release(&self, slots: &[Slot]) {
        for s in slots {
            let _ = self.store.release_slot(&s.key, &s.id).await;
        }
    }

    /// Writes the pending per-endpoint counters in one batch, if a flush is due
    /// (`every` µs since the last). Hosts call it off the request path. While the
    /// breaker is not closed the counters wait (bounded) instead of being lost.
    pub async fn flush_stats(&self, every: Micros) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let degraded = self.global.breaker.stats(now).degraded_us;
            let mut counted = lock(&self.totals.open_us_counted);
            let ms = (degraded - *counted) / 1_000;
            if ms > 0 {
                *counted += ms * 1_000;
                self.stats.bump(now, StatsField::BreakerOpenMs, ms as u64);
            }
        }
        if self.global.breaker.phase() != Phase::Closed {
            return Ok(());
        }
        match self.stats.take_due(now, every) {
            Some(batch) => self.store.write_batch(batch).await,
            None => Ok(()),
        }
    }

    /// Decides what happens to one request.
    pub async fn gate(&self, req: RequestHead<'_>) -> Decided {
        let mut later = vec![];
        let gate = match self.phases(&req, &mut later).await {
            Ok(g) | Err(g) => g,
        };
        Decided {
            gate,
            background: later,
        }
    }

    async fn phases(&self, req: &RequestHead<'_>, later: &mut Vec<Task>) -> Result<Gate, Gate> {
        let secret = self.credentials(req)?;
        let (record, config) = self.caller(secret, req, later).await?;
        self.deny_listed(&config, &record, req)?;
        let ctx = self.policies(&config, record, req)?;
        if ctx.policies.is_empty() {
            // a plan without policies: admitted, and counted like any decision
            self.count(&ctx, Outcome::Allowed, None);
            return Ok(Gate::forward(
                &ctx.record.id,
                ctx.route_name(),
                vec![],
                vec![],
            ));
        }
        if let Some(gate) = self.leased(&ctx, later).await {
            return Ok(gate);
        }
        self.deny_cached(&ctx)?;
        let owned: Arc<Vec<OwnedCheck>> = Arc::new(
            ctx.policies
                .iter()
                .map(|(key, p)| OwnedCheck {
                    key: key.clone(),
                    quota: *p.quota(),
                    cost: p.cost(),
                    shadow: p.shadow(),
                })
                .collect(),
        );
        let (verdict, latency) = self.check(&ctx, &owned, later).await?;
        let headers = self.admitted(&ctx, &verdict)?;
        let slots = match self.take_slots(&ctx, later).await {
            Ok(Ok(slots)) => slots,
            Ok(Err(())) => {
                later.push(self.refund_task(owned, verdict));
                self.count(&ctx, Outcome::Throttled, latency);
                self.count_policies(&ctx, |_, p| {
                    (!p.shadow() && p.max_in_flight().is_some()).then_some(PolicyOutcome::Throttled)
                });
                return Err(Gate::json(
                    floodgate_shared::contract::DENIED_STATUS,
                    "Too many requests in flight",
                    Some("wait for a response before sending more"),
                )
                .with_header("Retry-After", "1"));
            }
            Err(e) => {
                let limited = ctx.enforced().filter(|(_, p)| p.max_in_flight().is_some());
                if FailureMode::strictest(limited.map(|(_, p)| p.failure_mode()))
                    == FailureMode::FailClosed
                {
                    later.push(self.refund_task(owned, verdict));
                    return Err(self.degraded_refusal(
                        Some(&ctx),
                        ctx.route_name(),
                        &format!("in-flight slots unavailable: {e}"),
                    ));
                }
                // fail_open and local_fallback: admit without a slot
                self.count(&ctx, Outcome::Allowed, latency);
                self.count_admitted(&ctx, Some(&verdict));
                return Ok(
                    Gate::forward(&ctx.record.id, ctx.route_name(), headers, vec![])
                        .with_header(DEGRADED_HEADER, "fail-open"),
                );
            }
        };
        self.count(&ctx, Outcome::Allowed, latency);
        self.count_admitted(&ctx, Some(&verdict));
        Ok(Gate::forward(
            &ctx.record.id,
            ctx.route_name(),
            headers,
            slots,
        ))
    }

    /// Phase 1: the API key from the credentials header (shape only, no lookup).
    fn credentials<'r>(&self, req: &RequestHead<'r>) -> Result<&'r str, Gate> {
        key_from_header(req.credentials, self.settings.bearer).map_err(|p| match p {
            KeyProblem::Missing => Gate::json(
                401,
                "Missing API key",
                Some("send Authorization: Bearer <your API key>"),
            ),
            KeyProblem::Malformed => Gate::json(401, "Invalid API key", None),
        })
    }

    /// Phase 2: the caller's key record and the configuration, from the caches or
    /// in ONE store round trip for whatever is missing. What expired less than a
    /// TTL ago is served stale and refreshed in the background (one refresh at a
    /// time each), so a busy instance never waits for the global store here; a
    /// configuration never read or older, or a key never seen, older, or known not
    /// to exist, is read on the request's path. Unknown keys are charged to their address's budget; a store
    /// that cannot answer leaves the stale cache, or the failure mode of every
    /// policy the request could match.
    async fn caller(
        &self,
        secret: &str,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
    ) -> Result<(KeyRecord, Arc<EdgeConfig>), Gate> {
        let now = self.clock.now();
        let hash = hash_secret(secret);
        let key = self.records.key(&hash, now);
        let config = self.records.config(now);
        let need_key = !matches!(key, Lookup::Fresh(_));
        let counter = if need_key {
            &self.totals.key_cache_misses
        } else {
            &self.totals.key_cache_hits
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if need_key
            && key == Lookup::Missing
            && let Err(wait) = self.unknown_keys.room(req.client_ip, now)
        {
            self.totals
                .unknown_key_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(Gate::json(
                429,
                "Too many invalid API keys",
                Some("this address sent too many API keys that do not exist; retry later"),
            )
            .with_header("Retry-After", ceil_secs(wait).max(1).to_string()));
        }
        let need_config = !matches!(config, Lookup::Fresh(_));
        // a stale record of an existing key and a stale configuration are served
        let on_path = matches!(config, Lookup::Missing | Lookup::Old(_))
            || matches!(key, Lookup::Missing | Lookup::Old(_) | Lookup::Stale(None));
        let (key, config) = if on_path {
            self.refresh(&hash, need_key, need_config, key, config, req, later)
                .await?
        } else {
            if need_key || need_config {
                self.revalidate(&hash, need_key, need_config, now, later);
            }
            (key.any().flatten(), config.any().expect("fresh or stale"))
        };
        match key {
            Some(r) if r.status == KeyStatus::Active => Ok((r, config)),
            Some(_) => Err(Gate::json(401, "API key revoked", None)),
            None => Err(Gate::json(401, "Invalid API key", None)),
        }
    }

    /// Reads what the caches miss (key record, configuration or both) in one call.
    /// Until a configuration was ever read, the read waits until the start-up
    /// wait is over (counted from the first request that needed it) rather than
    /// the deadline alone.
    #[allow(clippy::too_many_arguments)]
    async fn refresh(
        &self,
        hash: &str,
        need_key: bool,
        need_config: bool,
        key: Lookup<Option<KeyRecord>>,
        config: Lookup<Arc<EdgeConfig>>,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
    ) -> Result<(Option<KeyRecord>, Arc<EdgeConfig>), Gate> {
        let names = record_names(hash, need_key, need_config);
        let store = self.store.clone();
        let read = boxed(async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            store.get_many(&refs).await
        });
        let now = self.clock.now();
        let mut deadline = self.global.deadline(now);
        if matches!(config, Lookup::Missing) {
            let first = *lock(&self.first_read).get_or_insert(now);
            deadline = deadline.max(first + self.settings.startup_wait - now);
        }
        let called = self.call_within(&self.global, &self.store, deadline, read);
        let values = match called.await {
            Called::Done(v) => v,
            Called::Failed(e, late) => {
                later.extend(late.map(drain));
                // the store cannot answer: serve what the caches hold, however old
                return match (key.any(), config.any()) {
                    (Some(k), Some(c)) => Ok((k, c)),
                    (_, c) => Err(self.unverified(c.as_deref(), req, &e)),
                };
            }
        };
        let now = self.clock.now();
        let mut values = values.into_iter();
        let config = if need_config {
            let raw = values.next().flatten();
            match load_config(&self.records, &self.totals, self.settings.log, raw, now) {
                Ok(c) => c,
                // a broken or missing configuration: keep the last good one
                Err(why) => match config.any() {
                    Some(c) => c,
                    None => return Err(self.degraded_refusal(None, None, &why)),
                },
            }
        } else {
            config.any().expect("fresh")
        };
        let key = if need_key {
            let raw = values.next().flatten();
            let record = load_key(&self.records, &self.totals, hash.to_string(), raw, now);
            if record.is_none() {
                self.unknown_keys.charge(req.client_ip, now);
            }
            record
        } else {
            key.any().flatten()
        };
        Ok((key, config))
    }

    /// Refreshes an expired configuration and key record (`hash`) in the
    /// background, one refresh at a time each, while requests are answered from
    /// the stale copies. Not while the global breaker is open (the copies serve on;
    /// the first request after it closes refreshes). A refresh that fails leaves
    /// the copies and lets the next request try again.
    fn revalidate(&self, hash: &str, key: bool, config: bool, now: Micros, later: &mut Vec<Task>) {
        if self.global.breaker.phase() != Phase::Closed {
            return;
        }
        let config = config && self.records.claim_config(now);
        let key = key && self.records.claim_key(hash, now);
        if !key && !config {
            return;
        }
        let names = record_names(hash, key, config);
        let (store, records, totals) = (
            self.store.clone(),
            self.records.clone(),
            self.totals.clone(),
        );
        let (log, hash) = (self.settings.log, hash.to_string());
        later.push(boxed(async move {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let Ok(values) = store.get_many(&refs).await else {
                if config {
                    records.release_config();
                }
                if key {
                    records.release_key(&hash);
                }
                return;
            };
            let mut values = values.into_iter();
            if config {
                // a broken configuration is logged and the last good one serves on
                let _ = load_config(&records, &totals, log, values.next().flatten(), now);
            }
            if key {
                load_key(&records, &totals, hash, values.next().flatten(), now);
            }
        }));
    }

    /// A caller whose key cannot be verified because the store is unreachable:
    /// forwarded without an identity when every policy the request could match
    /// fails open, else refused (503). Both are marked and counted.
    fn unverified(
        &self,
        config: Option<&EdgeConfig>,
        req: &RequestHead<'_>,
        e: &StoreError,
    ) -> Gate {
        let why = format!("cannot verify the API key: {e}");
        let Some(config) = config else {
            return self.degraded_refusal(None, None, &why);
        };
        let route = config.routes().resolve(req.path);
        let candidates = config.any_caller(route, req.client_ip.is_some());
        let route_name = route.map(|r| r.name.as_str());
        match FailureMode::strictest(candidates.iter().map(|p| p.failure_mode())) {
            FailureMode::FailOpen => {
                self.degraded(None, FailureMode::FailOpen, route_name);
                Gate::Forward {
                    key_id: None,
                    route: route_name.map(str::to_string),
                    headers: vec![(DEGRADED_HEADER, "fail-open".into())],
                    slots: vec![],
                }
            }
            // a local share needs the key's plan: an unverified key has none
            FailureMode::LocalFallback | FailureMode::FailClosed => {
                self.degraded_refusal(None, route_name, &why)
            }
        }
    }

    /// Counts a degraded answer under `mode` (per route too; per key and in the
    /// sample when the caller is known).
    fn degraded(&self, ctx: Option<&Ctx<'_>>, mode: FailureMode, route: Option<&str>) {
        let now = self.clock.now();
        match ctx {
            Some(c) => {
                self.stats
                    .record(now, route, &c.record, Outcome::Degraded, None);
                self.count_policies(c, |_, p| {
                    (!p.shadow()).then_some(PolicyOutcome::Degraded(mode))
                });
            }
            None => self.stats.record_unkeyed(now, route, Outcome::Degraded),
        }
        self.stats.record_degraded_mode(now, route, mode);
        match mode {
            FailureMode::FailOpen => &self.totals.fail_open,
            FailureMode::FailClosed => &self.totals.fail_closed,
            FailureMode::LocalFallback => &self.totals.local_fallback,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// 503, marked fail-closed and counted: the limiter could not decide.
    fn degraded_refusal(&self, ctx: Option<&Ctx<'_>>, route: Option<&str>, why: &str) -> Gate {
        self.degraded(ctx, FailureMode::FailClosed, route);
        Gate::unavailable(why).with_header(DEGRADED_HEADER, "fail-closed")
    }

    /// Between phases 2 and 3: the deny lists (cached with the configuration: no
    /// store call). A
    /// listed caller gets a 403 naming nothing, before any bucket is checked; it is
    /// counted per list.
    fn deny_listed(
        &self,
        config: &EdgeConfig,
        record: &KeyRecord,
        req: &RequestHead<'_>,
    ) -> Result<(), Gate> {
        let visitor = Visitor {
            key_id: Some(&record.id),
            ip: req.client_ip,
            country: req.country,
            user_agent: req.user_agent,
        };
        match config.deny().matches(&visitor) {
            None => Ok(()),
            Some(list) => {
                self.stats
                    .bump(self.clock.now(), StatsField::Denied(list), 1);
                Err(Gate::json(403, "Forbidden", None))
            }
        }
    }

    /// Phase 3: the buckets this request must pass.
    fn policies<'c>(
        &self,
        config: &'c EdgeConfig,
        record: KeyRecord,
        req: &RequestHead<'_>,
    ) -> Result<Ctx<'c>, Gate> {
        let route = config.routes().resolve(req.path);
        let policies = match config.checks(&record.id, &record.plan, route, req.client_ip) {
            None => {
                return Err(Gate::json(
                    403,
                    "The API key's plan is not configured",
                    None,
                ));
            }
            Some(Err(e)) => {
                return Err(Gate::json(
                    403,
                    "The request cannot be rate limited",
                    Some(&e.to_string()),
                ));
            }
            Some(Ok(c)) => c,
        };
        Ok(Ctx {
            config,
            record,
            route,
            policies,
            started: self.clock.now(),
        })
    }

    fn count(&self, ctx: &Ctx<'_>, outcome: Outcome, latency: Option<u64>) {
        self.stats.record(
            self.clock.now(),
            ctx.route_name(),
            &ctx.record,
            outcome,
            latency,
        );
    }

    /// Counts the request under each of its policies `outcome_of` (given the
    /// policy's index in `ctx.policies`) names an outcome for
    /// ([`PolicyOutcome`]: who allowed, who throttled, on which route).
    fn count_policies(
        &self,
        ctx: &Ctx<'_>,
        outcome_of: impl Fn(usize, &Policy) -> Option<PolicyOutcome>,
    ) {
        let endpoint = Endpoint::of(ctx.route_name());
        let fields = ctx.policies.iter().enumerate().filter_map(|(i, (_, p))| {
            let o = outcome_of(i, p)?;
            Some(StatsField::PolicyDecision(
                p.name().to_string(),
                endpoint.clone(),
                o,
            ))
        });
        self.stats.bump_each(self.clock.now(), fields);
    }

    /// Counts an admitted request under its policies: `allowed`, or
    /// `shadow_throttled` for a shadow policy the verdict denied.
    fn count_admitted(&self, ctx: &Ctx<'_>, verdict: Option<&Verdict>) {
        self.count_policies(ctx, |i, p| {
            let denied = verdict
                .and_then(|v| v.decisions.get(i))
                .is_some_and(|d| !d.allowed());
            Some(if p.shadow() && denied {
                PolicyOutcome::ShadowThrottled
            } else {
                PolicyOutcome::Allowed
            })
        });
    }

    /// Phase 4: a request whose policies are all leased (`bounded`, or `auto` and hot
    /// here) is decided from tokens at hand — this instance's leases, or its
    /// region's pool in ONE regional call — and admitted without a global round
    /// trip. `None`: the exact path decides (tokens not at hand, an exact, shadow or
    /// in-flight-limited policy, the regional store unreachable). Leases are
    /// refilled ahead in the background.
    async fn leased(&self, ctx: &Ctx<'_>, later: &mut Vec<Task>) -> Option<Gate> {
        let gate = self.try_leased(ctx, later).await;
        for g in self.leases.take_given_back() {
            later.push(self.give_back(g));
        }
        let how = if gate.is_some() {
            Leasing::Local
        } else {
            Leasing::Exact
        };
        let fields = ctx
            .policies
            .iter()
            .filter(|(_, p)| p.consistency() != Consistency::Exact)
            .map(|(_, p)| StatsField::Leasing(p.name().to_string(), how));
        self.stats.bump_each(ctx.started, fields);
        gate
    }

    /// Gives a cooled `auto` key's lease back to the global bucket, in the
    /// background (Redis' clock: the lease's times are Redis').
    fn give_back(&self, g: GiveBack) -> Task {
        let store = self.store.clone();
        boxed(async move {
            let args = [
                String::new(),
                g.emission.to_string(),
                g.member,
                g.unused.to_string(),
            ];
            let _ = store.return_lease(&g.key, &args).await;
        })
    }

    /// Counts a refill of `key` of `policy` about to be sent, with the tokens its
    /// leases had outstanding when last heard of.
    fn count_refill(&self, key: &str, policy: &Policy) {
        let now = self.clock.now();
        let name = policy.name().to_string();
        self.stats
            .bump(now, StatsField::Leasing(name.clone(), Leasing::Refills), 1);
        let outstanding = self.leases.outstanding(key);
        self.stats.bump(
            now,
            StatsField::Leasing(name, Leasing::Outstanding),
            outstanding,
        );
    }

    async fn try_leased(&self, ctx: &Ctx<'_>, later: &mut Vec<Task>) -> Option<Gate> {
        let now = ctx.started;
        if ctx.policies.iter().any(|(_, p)| {
            p.shadow() || p.max_in_flight().is_some() || p.consistency() == Consistency::Exact
        }) {
            return None;
        }
        // every policy is asked: `auto` ones record the request for their rate
        let leased = ctx
            .policies
            .iter()
            .filter(|(k, p)| self.leases.leased(k, p, now))
            .count();
        if leased < ctx.policies.len() {
            return None;
        }
        let buckets: Vec<(&str, &Policy)> =
            ctx.policies.iter().map(|(k, p)| (k.as_str(), *p)).collect();
        let decisions = match &self.regional {
            None => {
                for r in self.leases.refills_due(&buckets, ctx.config.regions(), now) {
                    if let Some((_, p)) = buckets.iter().find(|(k, _)| *k == r.key) {
                        self.count_refill(&r.key, p);
                        later.push(self.lease_refill(r, p, ctx.config.regions()));
                    }
                }
                self.leases.spend(&buckets, now)
            }
            Some(region) => {
                self.pool_take(region, &buckets, ctx.config.regions(), later)
                    .await
            }
        };
        let Some(decisions) = decisions else {
            self.totals.lease_misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if self.global.breaker.phase() != Phase::Closed || self.leases.global_failing() {
            self.totals
                .leased_while_down
                .fetch_add(1, Ordering::Relaxed);
        }
        let verdict = Verdict {
            admitted: true,
            now,
            shadow: vec![false; decisions.len()],
            decisions,
        };
        let headers = self.admitted(ctx, &verdict).ok()?;
        self.count(ctx, Outcome::Allowed, None);
        self.count_admitted(ctx, None);
        Some(Gate::forward(
            &ctx.record.id,
            ctx.route_name(),
            headers,
            vec![],
        ))
    }

    /// Spends every bucket's cost from the region's pools in one call: the
    /// decisions, or `None` (a pool lacked tokens, or the regional store did not
    /// answer in time). Pools that ran low are refilled by this caller when it got
    /// their lock.
    async fn pool_take(
        &self,
        region: &Regional<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        later: &mut Vec<Task>,
    ) -> Option<Vec<floodgate_shared::bucket::Decision>> {
        let now = self.clock.now();
        let (mut keys, mut locks, mut credits) = (vec![], vec![], vec![]);
        for (k, _) in buckets {
            let [pool, lock, credit] = pool_keys(k);
            keys.push(pool);
            locks.push(lock);
            credits.push(credit);
        }
        keys.extend(locks);
        keys.extend(credits);
        let asks: Vec<PoolAsk> = buckets
            .iter()
            .map(|(_, p)| PoolAsk {
                cost: u64::from(p.cost()),
                low: LeaseSettings::pool_target(p, regions) / 2 + 1,
                credit: LeaseSettings::credit(p, regions),
            })
            .collect();
        let lock_ms = (self.settings.leases.lifetime / 2_000).max(1) as u64;
        // the regional store's own clock: a pool take it runs late spends tokens of
        // a request the exact path then decided (a shortfall, never an overshoot)
        let args = pool_take_args(String::new(), &asks, lock_ms);
        let store = region.store.clone();
        let n = buckets.len();
        let fut = boxed(async move {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            store.run_ints(&POOL_TAKE, &refs, &args).await
        });
        let reply = match self.call_to(&region.lane, &region.store, fut).await {
            Called::Done(r) => r,
            Called::Failed(_, late) => {
                later.extend(late.map(drain));
                return None;
            }
        };
        let taken = PoolTaken::from_reply(&reply, n).ok().flatten()?;
        for (i, (k, p)) in buckets.iter().enumerate() {
            if taken.refill[i] {
                self.count_refill(k, p);
                let r =
                    self.leases
                        .pool_refill(k, p, regions, &taken.retire[i], taken.unconfirmed[i]);
                later.push(self.pool_refill(region, r, p, regions));
            }
        }
        taken
            .admitted
            .then(|| self.leases.pool_decisions(buckets, &taken.left, now))
    }

    /// Takes a lease for this instance from the global bucket (cost 0), retiring
    /// the spent ones, in the background.
    fn lease_refill(&self, r: Refill, policy: &Policy, regions: u32) -> Task {
        let store = self.store.clone();
        let leases = self.leases.clone();
        let cfg = self.settings.leases.for_policy(policy, regions);
        let q = *policy.quota();
        let sent = self.clock.now();
        boxed(async move {
            let args = cfg.take_args(
                None,
                q.burst_window(),
                q.emission_interval(),
                0,
                r.want,
                &r.id,
                Some(&r.retire),
            );
            let got = store.take_lease(&r.key, &args).await.ok();
            let full_at = got.map(|t| sent + (t.full_at - t.now).max(0));
            leases.refilled(&r, got.as_ref(), sent, full_at, true);
        })
    }

    /// Refills a regional pool from the global bucket, in the background: ONE global
    /// call charges what the region admitted on credit (into debt if need be),
    /// retires the pool's spent chunks and leases more; then the chunk is added to
    /// the pool, spendable until the global lease expires as reckoned from the send,
    /// and the charged credit taken off.
    fn pool_refill(&self, region: &Regional<S>, r: Refill, policy: &Policy, regions: u32) -> Task {
        let (global, regional) = (self.store.clone(), region.store.clone());
        let leases = self.leases.clone();
        let cfg = LeaseConfig {
            max_lease: r.want,
            ..self.settings.leases.for_policy(policy, regions)
        };
        let q = *policy.quota();
        let sent = self.clock.now();
        boxed(async move {
            let watch = Stopwatch::start();
            let args = cfg.charge_args(
                q.burst_window(),
                q.emission_interval(),
                r.charge,
                r.want,
                &r.id,
                Some(&r.retire),
            );
            let got = global.take_lease(&r.key, &args).await.ok();
            let life = cfg.lifetime - watch.elapsed().as_micros() as i64 - POOL_MARGIN;
            let (member, tokens) = match &got {
                Some(t) if t.leased > 0 && life > 0 => (r.member(t), t.leased),
                _ => (String::new(), 0),
            };
            let [pool, lock, credit] = pool_keys(&r.key);
            // charged when the global store answered; all the region's charged credit
            // is released once the bucket is out of debt (else it stays used)
            let charged = if got.is_some() { r.charge } else { 0 };
            let clear = got.is_some_and(|t| t.full_at - t.now <= q.burst_window());
            let args = [
                member,
                tokens.to_string(),
                life.max(0).to_string(),
                charged.to_string(),
                if clear { "1" } else { "0" }.to_string(),
            ];
            let _ = regional
                .run_ints(&POOL_ADD, &[&pool, &lock, &credit], &args)
                .await;
            let full_at = got.map(|t| sent + (t.full_at - t.now).max(0));
            leases.refilled(&r, got.as_ref(), sent, full_at, false);
        })
    }

    /// Phase 4: a bucket the store denied a moment ago is answered here, with the
    /// quota headers (and IETF fields) of the denying policies, until it can
    /// admit the request again.
    fn deny_cached(&self, ctx: &Ctx<'_>) -> Result<(), Gate> {
        if !self.settings.deny_cache {
            return Ok(());
        }
        let now = ctx.started;
        let hits = self
            .denied
            .lookup(ctx.enforced().map(|(k, _)| k.as_str()), now);
        let Some((_, worst)) = hits.iter().max_by_key(|(_, d)| d.until) else {
            return Ok(());
        };
        self.count(ctx, Outcome::Throttled, None);
        let denying: Vec<&str> = hits
            .iter()
            .filter_map(|(i, _)| ctx.enforced().nth(*i).map(|(_, p)| p.name()))
            .collect();
        self.count_policies(ctx, |_, p| {
            (!p.shadow() && denying.contains(&p.name())).then_some(PolicyOutcome::Throttled)
        });
        let wait = ceil_secs(worst.until - now).max(1);
        let headers = RateLimitHeaders {
            limit: worst.limit,
            remaining: 0,
            reset: ceil_secs(worst.full_at.max(now)),
            retry_after: Some(jittered(
                wait,
                ctx.config.headers().retry_jitter_secs,
                jitter_seed(&ctx.record.id, now),
            )),
        };
        let mut gate = Gate::rate_limited(&headers);
        if ctx.config.headers().ietf {
            let enforced: Vec<&(String, &Policy)> = ctx.enforced().collect();
            let decisions: Vec<(&Policy, floodgate_shared::bucket::Decision)> = hits
                .iter()
                .map(|(i, d)| {
                    let p = enforced[*i].1;
                    (
                        p,
                        floodgate_shared::bucket::Decision {
                            outcome: floodgate_shared::Outcome::Denied {
                                retry_after: Some(d.until - now),
                            },
                            limit: d.limit,
                            remaining: 0,
                            now,
                            full_at: d.full_at.max(now),
                        },
                    )
                })
                .collect();
            let states: Vec<PolicyState<'_>> = decisions
                .iter()
                .map(|(p, d)| PolicyState {
                    name: p.name(),
                    quota: p.quota(),
                    decision: d,
                })
                .collect();
            gate = gate.with_headers(ietf_fields(&states).map(Vec::from).unwrap_or_default());
        }
        Err(gate)
    }

    /// Phase 5: the bucket check, ONE store call for every policy. A store that
    /// cannot answer in time gets the policies' failure mode.
    /// The verdict and the call's latency (µs).
    async fn check(
        &self,
        ctx: &Ctx<'_>,
        owned: &Arc<Vec<OwnedCheck>>,
        later: &mut Vec<Task>,
    ) -> Result<(Verdict, Option<u64>), Gate> {
        let sent = self.clock.now();
        let deadline = self.global.deadline(sent);
        let when = self.until(sent, deadline);
        let store = self.store.clone();
        let calls = owned.clone();
        let fut = boxed(async move {
            let checks = as_checks(&calls);
            store.check(&checks, when).await
        });
        let called = self
            .call_within(&self.global, &self.store, deadline, fut)
            .await;
        let finished = self.clock.now();
        let latency = u64::try_from(finished - sent).ok();
        match called {
            Called::Done(verdict) => {
                self.leases.global_answered(true);
                self.offset.observe(verdict.now, finished);
                for ((k, p), d) in ctx.policies.iter().zip(&verdict.decisions) {
                    if p.consistency() != Consistency::Exact {
                        self.leases.observe(k, d, finished);
                    }
                }
                if self.settings.deny_cache && !verdict.admitted {
                    self.remember_denials(ctx, &verdict, sent, finished);
                }
                if verdict.shadow_denied() && verdict.admitted {
                    self.stats
                        .record_shadow(finished, ctx.route_name(), &ctx.record.id);
                }
                if !verdict.admitted {
                    // (admitted requests are counted once their slots are settled)
                    self.count(ctx, Outcome::Throttled, latency);
                    self.count_policies(ctx, |i, p| {
                        let denied = verdict.decisions.get(i).is_some_and(|d| !d.allowed());
                        (!p.shadow() && denied).then_some(PolicyOutcome::Throttled)
                    });
                }
                Ok((verdict, latency))
            }
            Called::Failed(e, late) => {
                self.leases.global_answered(false);
                let (gate, refused) = self.failure_mode(ctx, &e);
                match late {
                    // the call may still admit in Redis: give that back
                    Some(late) if refused => {
                        let store = self.store.clone();
                        let totals = self.totals.clone();
                        let owned = owned.clone();
                        later.push(boxed(async move {
                            if let Ok(v) = late.await
                                && v.admitted
                            {
                                let checks = as_checks(&owned);
                                if store.refund(&checks, &v).await.is_ok() {
                                    totals.refunds.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }));
                    }
                    late => later.extend(late.map(drain)),
                }
                Err(gate)
            }
        }
    }

    /// Remembers the denying buckets of `verdict` until they admit again.
    fn remember_denials(&self, ctx: &Ctx<'_>, verdict: &Verdict, sent: Micros, finished: Micros) {
        for ((key, _), d) in ctx
            .policies
            .iter()
            .zip(&verdict.decisions)
            .filter(|((_, p), _)| !p.shadow())
        {
            if let floodgate_shared::Outcome::Denied {
                retry_after: Some(wait),
            } = d.outcome
            {
                // Redis decided somewhere between `sent` and `finished` on our
                // clock; anchoring at `sent` can only end the local denial early
                // (the store then decides), never late.
                let denied = Denied {
                    until: sent + wait,
                    full_at: sent + (d.full_at - d.now),
                    limit: d.limit,
                };
                self.denied.remember(key, denied, finished);
            }
        }
    }

    /// The answer to a store that could not decide: the strictest failure mode of
    /// the request's policies, marked and counted. Also says whether the client
    /// was refused (so a late admission must be refunded).
    fn failure_mode(&self, ctx: &Ctx<'_>, e: &StoreError) -> (Gate, bool) {
        let mode = ctx.mode();
        let route = ctx.route_name();
        match mode {
            FailureMode::FailClosed => {
                let g = self.degraded_refusal(
                    Some(ctx),
                    route,
                    &format!("rate limit state unavailable: {e}"),
                );
                (g, true)
            }
            FailureMode::FailOpen => {
                self.degraded(Some(ctx), mode, ctx.route_name());
                let g = Gate::forward(&ctx.record.id, route, vec![], vec![])
                    .with_header(DEGRADED_HEADER, "fail-open");
                (g, false)
            }
            FailureMode::LocalFallback => {
                self.degraded(Some(ctx), mode, ctx.route_name());
                let local: Vec<(&str, &Quota, u32)> = ctx
                    .enforced()
                    .filter_map(|(k, p)| p.local_quota().map(|q| (k.as_str(), q, p.cost())))
                    .collect();
                let verdict = self.local.check(&local, self.clock.now());
                match Answer::for_decision(verdict.headline()) {
                    Answer::Forward { headers } => {
                        let g = Gate::forward(&ctx.record.id, route, headers.pairs(), vec![])
                            .with_header(DEGRADED_HEADER, "local-fallback");
                        (g, false)
                    }
                    Answer::Reject { headers, .. } => {
                        let g = Gate::rate_limited(&headers)
                            .with_header(DEGRADED_HEADER, "local-fallback");
                        (g, true)
                    }
                }
            }
        }
    }

    /// Phase 6: the verdict's answer: the quota headers to add when admitted, or
    /// the 429 with Retry-After (jittered, never early) and the IETF fields.
    fn admitted(
        &self,
        ctx: &Ctx<'_>,
        verdict: &Verdict,
    ) -> Result<Vec<(&'static str, String)>, Gate> {
        match Answer::for_decision(verdict.headline()) {
            Answer::Forward { headers } => {
                let mut h = headers.pairs();
                h.extend(ietf(ctx.config, &ctx.policies, verdict));
                Ok(h)
            }
            Answer::Reject { mut headers, .. } => {
                headers.retry_after = headers.retry_after.map(|w| {
                    jittered(
                        w,
                        ctx.config.headers().retry_jitter_secs,
                        jitter_seed(&ctx.record.id, verdict.now),
                    )
                });
                Err(Gate::rate_limited(&headers).with_headers(ietf(
                    ctx.config,
                    &ctx.policies,
                    verdict,
                )))
            }
        }
    }

    /// Gives back an admitted verdict's tokens (its request was refused after all).
    fn refund_task(&self, owned: Arc<Vec<OwnedCheck>>, verdict: Verdict) -> Task {
        let store = self.store.clone();
        let totals = self.totals.clone();
        boxed(async move {
            let checks = as_checks(&owned);
            if store.refund(&checks, &verdict).await.is_ok() {
                totals.refunds.fetch_add(1, Ordering::Relaxed);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_call_may_run_for_longer_than_its_answer_deadline() {
        assert_eq!(
            store_deadline(Duration::from_millis(3)),
            Duration::from_secs(1)
        );
        assert_eq!(
            store_deadline(Duration::from_millis(100)),
            Duration::from_secs(2)
        );
        assert_eq!(
            store_deadline(Duration::from_secs(5)),
            Duration::from_secs(10)
        );
    }
}
