//! The edge's request pipeline, free of any host: authenticate the API key, resolve
//! the policies that apply, check them all in ONE store round trip, and tell the
//! host what to do — answer directly (401/403/429/503) or forward upstream with
//! the quota headers. The Worker and the native host are thin adapters around it.
//!
//! Configuration and key records are cached in memory for a short TTL, so a warm
//! request costs one round trip in total (the bucket check). A revoked key stops
//! working within that TTL.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::apikeys::{
    KeyProblem, KeyRecord, KeyStatus, hash_secret, key_from_header, record_key,
};
use floodgate_shared::config::{CONFIG_KEY, EdgeConfig};
use floodgate_shared::contract::{
    Answer, DENIED_BODY, DENIED_STATUS, JSON_CONTENT_TYPE, PolicyState, RateLimitHeaders,
    ietf_fields, jittered,
};
use floodgate_shared::policy::{FailureMode, Quota};
use floodgate_shared::script::Check;
use floodgate_shared::time::{Clock, MICROS_PER_SEC, Micros};

use crate::breaker::{Breaker, BreakerStats, Permit, Phase, Transition};
use crate::fallback::LocalBuckets;
use crate::stats::{Outcome, Stats};
use crate::store::{Store, StoreError};

/// What the pipeline needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The raw path, without the query.
    pub path: &'a str,
    /// The value of the credentials header, if any.
    pub credentials: Option<&'a [u8]>,
    pub client_ip: Option<IpAddr>,
}

/// What the host does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Answer now; the upstream never sees the request.
    Respond {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Forward upstream, identifying the caller by `key_id`, and add `headers` to
    /// the upstream's response.
    Forward {
        key_id: String,
        route: Option<String>,
        headers: Vec<(&'static str, String)>,
        /// In-flight slots taken for this request (policies with `max_in_flight`).
        /// The host releases them with [`Pipeline::release`] when the response is
        /// complete, the client goes away or the upstream times out; slots never
        /// released expire after [`PipelineConfig::in_flight_ttl`].
        slots: Vec<Slot>,
    },
}

/// One in-flight slot: its set and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub key: String,
    pub id: String,
}

/// How the pipeline behaves.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// `true`: credentials are `Authorization: Bearer <key>`; `false`: the header
    /// holds the key itself (the host picks the header).
    pub bearer: bool,
    /// How long configuration and key records are cached (µs).
    pub cache_ttl: Micros,
    /// Most key records cached at once (unknown keys included).
    pub max_cached_keys: usize,
    /// Answer a bucket that just denied locally until its Retry-After, without
    /// calling the store (see [`DenyCache`]).
    pub deny_cache: bool,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_threshold: u32,
    /// How long the open breaker keeps requests off the store (µs), before it
    /// health-checks the store.
    pub breaker_cool_down: Micros,
    /// How long an in-flight slot lives unless released (µs): slots of a crashed
    /// instance free themselves then. Longer than the longest request.
    pub in_flight_ttl: Micros,
    /// Where breaker transitions are logged (one line each): stderr natively, the
    /// console in the Worker.
    pub log: fn(&str),
}

/// Logs to stderr (natively; a no-op sink in wasm32, where hosts pass their own).
pub fn log_to_stderr(line: &str) {
    eprintln!("{line}");
}

/// Default breaker threshold: consecutive retryable failures that open it.
pub const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// Default breaker cool-down before the health check (µs).
pub const DEFAULT_BREAKER_COOL_DOWN: Micros = MICROS_PER_SEC;

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            bearer: true,
            cache_ttl: 5 * MICROS_PER_SEC,
            max_cached_keys: 100_000,
            deny_cache: true,
            breaker_threshold: DEFAULT_BREAKER_THRESHOLD,
            breaker_cool_down: DEFAULT_BREAKER_COOL_DOWN,
            log: log_to_stderr,
            in_flight_ttl: 60 * MICROS_PER_SEC,
        }
    }
}

struct Cached<T> {
    value: T,
    until: Micros,
}

/// The pipeline over a store `S` (RESP or REST) and a clock `C`.
pub struct Pipeline<S, C> {
    store: S,
    clock: C,
    settings: PipelineConfig,
    config: Mutex<Option<Cached<std::sync::Arc<EdgeConfig>>>>,
    keys: Mutex<HashMap<String, Cached<Option<KeyRecord>>>>,
    stats: Stats,
    denied: DenyCache,
    breaker: Breaker,
    local: LocalBuckets,
    totals: Totals,
    slot_ids: SlotIds,
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

enum SlotRefusal {
    Full,
    Store(StoreError),
}

/// Running totals since the instance started, for alerting (see [`Health`]).
#[derive(Default)]
struct Totals {
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    local_fallback: AtomicU64,
    /// µs of breaker time already written to `breaker|open_ms`.
    open_us_counted: Mutex<Micros>,
}

/// One instance's view of its store, served as JSON by the hosts
/// (`GET /__floodgate/health`) for alerting on fail-open duration and volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub breaker: Phase,
    pub stats: BreakerStats,
    /// Requests decided without Redis, per failure mode, since start.
    pub fail_open: u64,
    pub fail_closed: u64,
    pub local_fallback: u64,
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
        })
        .to_string()
    }
}

/// An exact deny cache. When the store denies a bucket with an exact wait `w`, the
/// bucket cannot admit the same request before `now + w` (a denial changes no state,
/// and only time refills), so until then the instance answers that bucket with a
/// 429 itself. It only ever denies, and only while the store would too: it never
/// admits a request the store would have denied, and it stops no later than the
/// instant the store would admit again (anchored at the call's start on this
/// instance's clock, so at most one round trip early, never late).
#[derive(Default)]
pub struct DenyCache {
    until: Mutex<HashMap<String, Denied>>,
}

#[derive(Clone, Copy)]
struct Denied {
    /// Local instant at which the bucket admits the request again.
    until: Micros,
    /// Local instant at which the bucket is full again (`X-RateLimit-Reset`).
    full_at: Micros,
    limit: u64,
}

/// Bound on cached denials; expired ones are dropped first.
const MAX_DENIED: usize = 100_000;

impl DenyCache {
    fn lookup(&self, keys: &[&str], now: Micros) -> Option<Denied> {
        let map = self.until.lock().expect("deny cache lock");
        keys.iter()
            .filter_map(|k| map.get(*k))
            .filter(|d| d.until > now)
            .max_by_key(|d| d.until)
            .copied()
    }

    fn remember(&self, key: &str, denied: Denied, now: Micros) {
        let mut map = self.until.lock().expect("deny cache lock");
        if map.len() >= MAX_DENIED {
            map.retain(|_, d| d.until > now);
            if map.len() >= MAX_DENIED {
                return;
            }
        }
        map.insert(key.to_string(), denied);
    }
}

/// Marks every answer given without Redis: `fail-open`, `fail-closed` or
/// `local-fallback` (see `docs/failure.md`).
pub const DEGRADED_HEADER: &str = "X-RateLimit-Degraded";

/// The mode applied when several policies match: fail_closed over local_fallback
/// over fail_open.
pub fn strictest(modes: impl Iterator<Item = FailureMode>) -> FailureMode {
    let rank = |m: &FailureMode| match m {
        FailureMode::FailOpen => 0,
        FailureMode::LocalFallback => 1,
        FailureMode::FailClosed => 2,
    };
    modes.max_by_key(rank).unwrap_or(FailureMode::FailOpen)
}

fn json_error(status: u16, error: &str, hint: Option<&str>) -> Gate {
    let body = match hint {
        Some(h) => serde_json::json!({ "error": error, "hint": h }),
        None => serde_json::json!({ "error": error }),
    };
    Gate::Respond {
        status,
        headers: vec![("Content-Type", "application/json".into())],
        body: body.to_string(),
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields for every enforced policy of
/// the request, when the configuration asks for them.
fn ietf(
    config: &EdgeConfig,
    checks: &[(String, &floodgate_shared::Policy)],
    verdict: &floodgate_shared::script::Verdict,
) -> Vec<(&'static str, String)> {
    if !config.headers().ietf {
        return vec![];
    }
    let states: Vec<PolicyState<'_>> = checks
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

/// The contract's 429: quota headers, Retry-After and the JSON body.
fn rate_limited(headers: RateLimitHeaders) -> Gate {
    let mut h = headers.pairs();
    h.push(("Content-Type", JSON_CONTENT_TYPE.into()));
    Gate::Respond {
        status: DENIED_STATUS,
        headers: h,
        body: DENIED_BODY.into(),
    }
}

fn unavailable(why: &str) -> Gate {
    let mut g = json_error(503, "Rate limiter unavailable", Some(why));
    if let Gate::Respond { headers, .. } = &mut g {
        headers.push(("Retry-After", "1".into()));
    }
    g
}

impl<S: Store, C: Clock> Pipeline<S, C> {
    pub fn new(store: S, clock: C, settings: PipelineConfig) -> Self {
        let slot_ids = SlotIds::new(clock.now());
        Self {
            store,
            clock,
            config: Mutex::new(None),
            keys: Mutex::new(HashMap::new()),
            stats: Stats::default(),
            denied: DenyCache::default(),
            local: LocalBuckets::default(),
            totals: Totals::default(),
            slot_ids,
            breaker: Breaker::new(settings.breaker_threshold, settings.breaker_cool_down),
            settings,
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The circuit breaker's counters (transitions, requests kept off the store,
    /// time degraded), for alerting.
    pub fn breaker_stats(&self) -> BreakerStats {
        self.breaker.stats(self.clock.now())
    }

    pub fn breaker_phase(&self) -> Phase {
        self.breaker.phase()
    }

    /// Logs a breaker transition, if there was one, and counts new outages.
    fn logged(&self, moved: Option<Transition>) {
        if let Some(t) = moved {
            (self.settings.log)(&t.to_string());
            if (t.from, t.to) == (Phase::Closed, Phase::Open) {
                self.stats.bump(t.at, "breaker|opened".into(), 1);
            }
        }
    }

    /// Takes one in-flight slot per policy with `max_in_flight`; all or none.
    async fn take_slots(
        &self,
        checks: &[(String, &floodgate_shared::Policy)],
    ) -> Result<Vec<Slot>, SlotRefusal> {
        let mut taken = vec![];
        for (key, p) in checks {
            let Some(limit) = p.max_in_flight().filter(|_| !p.shadow()) else {
                continue;
            };
            let slot = Slot {
                key: floodgate_shared::script::in_flight_key(key),
                id: self.slot_ids.next(),
            };
            let ttl_ms = (self.settings.in_flight_ttl / 1_000).max(1) as u64;
            let outcome = self
                .store
                .acquire_slot(&slot.key, &slot.id, limit, ttl_ms)
                .await;
            match outcome {
                Ok(true) => taken.push(slot),
                Ok(false) | Err(_) => {
                    self.release(&taken).await;
                    return Err(match outcome {
                        Err(e) => SlotRefusal::Store(e),
                        _ => SlotRefusal::Full,
                    });
                }
            }
        }
        Ok(taken)
    }

    /// Gives back in-flight slots (errors ignored: an unreleased slot expires).
    pub async fn release(&self, slots: &[Slot]) {
        for s in slots {
            let _ = self.store.release_slot(&s.key, &s.id).await;
        }
    }

    /// The breaker's phase and counters and the degraded totals, for alerting.
    pub fn health(&self) -> Health {
        Health {
            breaker: self.breaker.phase(),
            stats: self.breaker_stats(),
            fail_open: self.totals.fail_open.load(Ordering::Relaxed),
            fail_closed: self.totals.fail_closed.load(Ordering::Relaxed),
            local_fallback: self.totals.local_fallback.load(Ordering::Relaxed),
        }
    }

    /// Writes the pending per-endpoint counters in one batch, if a flush is due
    /// (`every` µs since the last). Hosts call it off the request path. While the
    /// breaker is not closed the counters wait (bounded) instead of being lost.
    pub async fn flush_stats(&self, every: Micros) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let degraded = self.breaker.stats(now).degraded_us;
            let mut counted = self.totals.open_us_counted.lock().expect("totals lock");
            let ms = (degraded - *counted) / 1_000;
            if ms > 0 {
                *counted += ms * 1_000;
                self.stats.bump(now, "breaker|open_ms".into(), ms as u64);
            }
        }
        if self.breaker.phase() != Phase::Closed {
            return Ok(());
        }
        match self.stats.take_due(now, every) {
            Some(batch) => self.store.write_batch(batch).await,
            None => Ok(()),
        }
    }

    async fn config(&self) -> Result<std::sync::Arc<EdgeConfig>, String> {
        let now = self.clock.now();
        if let Some(c) = self
            .config
            .lock()
            .expect("config lock")
            .as_ref()
            .filter(|c| c.until > now)
        {
            return Ok(c.value.clone());
        }
        if self.breaker.phase() != Phase::Closed
            && let Some(c) = self.config.lock().expect("config lock").as_ref()
        {
            return Ok(c.value.clone()); // the store is down: keep the last good one
        }
        let fetched = match self.store.get(CONFIG_KEY).await {
            Ok(Some(raw)) => std::str::from_utf8(&raw)
                .map_err(|_| "the stored configuration is not UTF-8".to_string())
                .and_then(|t| {
                    EdgeConfig::from_json(t)
                        .map_err(|e| format!("the stored configuration is invalid: {e}"))
                }),
            Ok(None) => Err("no configuration is stored (floodgate-cli config set)".to_string()),
            Err(e) => Err(format!("configuration unavailable: {e}")),
        };
        let mut slot = self.config.lock().expect("config lock");
        match fetched {
            Ok(c) => {
                let c = std::sync::Arc::new(c);
                *slot = Some(Cached {
                    value: c.clone(),
                    until: now + self.settings.cache_ttl,
                });
                Ok(c)
            }
            // keep serving the last good configuration while the store is unreachable
            Err(e) => slot.as_ref().map(|c| c.value.clone()).ok_or(e),
        }
    }

    async fn key(&self, secret: &str) -> Result<Option<KeyRecord>, StoreError> {
        let hash = hash_secret(secret);
        let now = self.clock.now();
        if let Some(c) = self
            .keys
            .lock()
            .expect("key cache lock")
            .get(&hash)
            .filter(|c| c.until > now || self.breaker.phase() != Phase::Closed)
        {
            // fresh, or stale while the breaker keeps requests off the store
            return Ok(c.value.clone());
        }
        let record = match self.store.get(&record_key(&hash)).await {
            Ok(raw) => raw.and_then(|raw| KeyRecord::from_json(&raw)),
            Err(e) => {
                // the store is unreachable: a record seen before (even expired) is
                // better than refusing every caller whatever their failure mode
                let cache = self.keys.lock().expect("key cache lock");
                return match cache.get(&hash) {
                    Some(c) if e.is_retryable() => Ok(c.value.clone()),
                    _ => Err(e),
                };
            }
        };
        let mut cache = self.keys.lock().expect("key cache lock");
        if cache.len() >= self.settings.max_cached_keys {
            cache.retain(|_, c| c.until > now);
            if cache.len() >= self.settings.max_cached_keys {
                cache.clear();
            }
        }
        cache.insert(
            hash,
            Cached {
                value: record.clone(),
                until: now + self.settings.cache_ttl,
            },
        );
        Ok(record)
    }

    /// Decides what happens to one request.
    pub async fn gate(&self, req: RequestHead<'_>) -> Gate {
        let secret = match key_from_header(req.credentials, self.settings.bearer) {
            Ok(s) => s,
            Err(KeyProblem::Missing) => {
                return json_error(
                    401,
                    "Missing API key",
                    Some("send Authorization: Bearer <your API key>"),
                );
            }
            Err(KeyProblem::Malformed) => return json_error(401, "Invalid API key", None),
        };
        let record = match self.key(secret).await {
            Ok(Some(r)) if r.status == KeyStatus::Active => r,
            Ok(Some(_)) => return json_error(401, "API key revoked", None),
            Ok(None) => return json_error(401, "Invalid API key", None),
            Err(e) => return unavailable(&format!("cannot verify the API key: {e}")),
        };
        let config = match self.config().await {
            Ok(c) => c,
            Err(e) => return unavailable(&e),
        };
        let route = config.routes().resolve(req.path);
        let checks = match config.checks(&record.id, &record.plan, route, req.client_ip) {
            None => return json_error(403, "The API key's plan is not configured", None),
            Some(Err(e)) => {
                return json_error(
                    403,
                    "The request cannot be rate limited",
                    Some(&e.to_string()),
                );
            }
            Some(Ok(c)) => c,
        };
        let route_name = route.map(|r| r.name.clone());
        if checks.is_empty() {
            return Gate::Forward {
                key_id: record.id,
                route: route_name,
                headers: vec![],
                slots: vec![],
            };
        }
        if self.settings.deny_cache {
            let now = self.clock.now();
            let keys: Vec<&str> = checks.iter().map(|(k, _)| k.as_str()).collect();
            if let Some(d) = self.denied.lookup(&keys, now) {
                self.stats.record(
                    now,
                    route_name.as_deref(),
                    Some(&record.id),
                    Outcome::Throttled,
                    None,
                );
                let wait = floodgate_shared::time::ceil_secs(d.until - now).max(1);
                return rate_limited(RateLimitHeaders {
                    limit: d.limit,
                    remaining: 0,
                    reset: floodgate_shared::time::ceil_secs(d.full_at.max(now)),
                    retry_after: Some(jittered(
                        wait,
                        config.headers().retry_jitter_secs,
                        jitter_seed(&record.id, now),
                    )),
                });
            }
        }
        let calls: Vec<Check<'_>> = checks
            .iter()
            .map(|(key, p)| Check {
                key,
                quota: p.quota(),
                cost: p.cost(),
                shadow: p.shadow(),
            })
            .collect();
        let started = self.clock.now();
        self.stats
            .sample(started, &record.id, &record.plan, route_name.as_deref());
        let (permit, moved) = self.breaker.permit(started);
        self.logged(moved);
        let result = match permit {
            Permit::Skip => Err(StoreError::new(
                crate::store::StoreErrorKind::Connect,
                "circuit breaker open: the store is not called",
            )),
            Permit::Probe => match self.store.ping().await {
                Ok(()) => {
                    self.logged(self.breaker.probe_succeeded(self.clock.now()));
                    self.store.check(&calls, None).await
                }
                Err(e) => {
                    // any failed health check reopens, whatever the error
                    self.logged(self.breaker.probe_failed(self.clock.now(), &e));
                    Err(e)
                }
            },
            Permit::Call => self.store.check(&calls, None).await,
        };
        let finished = self.clock.now();
        match &result {
            Ok(_) => self.logged(self.breaker.success(finished)),
            Err(e) if e.is_retryable() && permit != Permit::Skip => {
                self.logged(self.breaker.failure(finished, e))
            }
            Err(_) => {}
        }
        let latency = u64::try_from(finished - started).ok();
        let count = |outcome| {
            self.stats.record(
                finished,
                route_name.as_deref(),
                Some(&record.id),
                outcome,
                latency,
            )
        };
        if let (true, Ok(verdict)) = (self.settings.deny_cache, &result)
            && !verdict.admitted
        {
            for ((key, _), d) in checks
                .iter()
                .zip(&verdict.decisions)
                .filter(|((_, p), _)| !p.shadow())
            {
                if let floodgate_shared::Outcome::Denied {
                    retry_after: Some(wait),
                } = d.outcome
                {
                    // Redis decided somewhere between `started` and `finished` on
                    // our clock; anchoring at `started` can only end the local
                    // denial early (the store then decides), never late.
                    let denied = Denied {
                        until: started + wait,
                        full_at: started + (d.full_at - d.now),
                        limit: d.limit,
                    };
                    self.denied.remember(key, denied, finished);
                }
            }
        }
        match result {
            Ok(verdict) => match Answer::for_decision(verdict.headline()) {
                Answer::Forward { headers } => {
                    if verdict.shadow_denied() {
                        self.stats
                            .record_shadow(finished, route_name.as_deref(), &record.id);
                    }
                    let mut headers = headers.pairs();
                    headers.extend(ietf(&config, &checks, &verdict));
                    let slots = match self.take_slots(&checks).await {
                        Ok(slots) => slots,
                        Err(SlotRefusal::Full) => {
                            count(Outcome::Throttled);
                            let mut g = json_error(
                                DENIED_STATUS,
                                "Too many requests in flight",
                                Some("wait for a response before sending more"),
                            );
                            if let Gate::Respond { headers, .. } = &mut g {
                                headers.push(("Retry-After", "1".into()));
                            }
                            return g;
                        }
                        Err(SlotRefusal::Store(e)) => {
                            let limited =
                                checks.iter().filter(|(_, p)| p.max_in_flight().is_some());
                            if strictest(limited.map(|(_, p)| p.failure_mode()))
                                == FailureMode::FailClosed
                            {
                                count(Outcome::Degraded);
                                return unavailable(&format!("in-flight slots unavailable: {e}"));
                            }
                            // fail_open and local_fallback: admit without a slot
                            headers.push((DEGRADED_HEADER, "fail-open".into()));
                            vec![]
                        }
                    };
                    count(Outcome::Allowed);
                    Gate::Forward {
                        key_id: record.id,
                        route: route_name,
                        headers,
                        slots,
                    }
                }
                Answer::Reject { mut headers, .. } => {
                    count(Outcome::Throttled);
                    headers.retry_after = headers.retry_after.map(|w| {
                        jittered(
                            w,
                            config.headers().retry_jitter_secs,
                            jitter_seed(&record.id, finished),
                        )
                    });
                    let mut g = rate_limited(headers);
                    if let Gate::Respond { headers, .. } = &mut g {
                        headers.extend(ietf(&config, &checks, &verdict));
                    }
                    g
                }
            },
            Err(e) => {
                count(Outcome::Degraded);
                // An explicit decision: the strictest mode among the matching policies.
                let mode = strictest(
                    checks
                        .iter()
                        .filter(|(_, p)| !p.shadow())
                        .map(|(_, p)| p.failure_mode()),
                );
                self.stats
                    .record_degraded_mode(finished, route_name.as_deref(), mode.name());
                match mode {
                    FailureMode::FailOpen => &self.totals.fail_open,
                    FailureMode::FailClosed => &self.totals.fail_closed,
                    FailureMode::LocalFallback => &self.totals.local_fallback,
                }
                .fetch_add(1, Ordering::Relaxed);
                match mode {
                    FailureMode::FailClosed => {
                        let mut g = unavailable(&format!("rate limit state unavailable: {e}"));
                        if let Gate::Respond { headers, .. } = &mut g {
                            headers.push((DEGRADED_HEADER, "fail-closed".into()));
                        }
                        g
                    }
                    FailureMode::LocalFallback => {
                        let local: Vec<(&str, &Quota, u32)> = checks
                            .iter()
                            .filter(|(_, p)| !p.shadow())
                            .filter_map(|(k, p)| p.local_quota().map(|q| (k.as_str(), q, p.cost())))
                            .collect();
                        let verdict = self.local.check(&local, finished);
                        match Answer::for_decision(verdict.headline()) {
                            Answer::Forward { headers } => {
                                let mut h = headers.pairs();
                                h.push((DEGRADED_HEADER, "local-fallback".into()));
                                Gate::Forward {
                                    key_id: record.id,
                                    route: route_name,
                                    headers: h,
                                    slots: vec![],
                                }
                            }
                            Answer::Reject { headers, .. } => {
                                let mut g = rate_limited(headers);
                                if let Gate::Respond { headers, .. } = &mut g {
                                    headers.push((DEGRADED_HEADER, "local-fallback".into()));
                                }
                                g
                            }
                        }
                    }
                    FailureMode::FailOpen => Gate::Forward {
                        key_id: record.id,
                        route: route_name,
                        headers: vec![(DEGRADED_HEADER, "fail-open".into())],
                        slots: vec![],
                    },
                }
            }
        }
    }
}
