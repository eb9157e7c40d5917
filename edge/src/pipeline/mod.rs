//! The edge's request pipeline, free of any host: what happens to one request,
//! read top to bottom in [`Pipeline::gate`], one call per phase, each phase in
//! its own file:
//!
//! 1. **credentials** ([`caller`]): the API key from its header, by shape only;
//! 2. **caller** ([`caller`]): its key record and the configuration, cached (a
//!    warm request reads nothing; they stay good while the records' revision does,
//!    see [`revision`]), in ONE store round trip for what is missing;
//! 3. **block lists** ([`blocklists`]): a listed caller gets a 403, no store call;
//! 4. **limits** ([`limits`]): the policies of the caller's plan that match the
//!    route and address, each with its bucket;
//! 5. **leasing** ([`leasing`]): bounded-consistency policies decided from tokens
//!    leased ahead, without the global store (never for a key with credits:
//!    credits are always exact, see `shared/src/credits.rs`);
//! 6. **recent 429s** ([`throttled`]): a bucket the store throttled a moment ago
//!    is answered here until it admits again;
//! 7. **the check** ([`check`]): ONE global call decides every bucket and the
//!    key's credits, all or nothing; a store that cannot answer gets the
//!    policies' failure mode (fail-closed for a key with credits); identical
//!    concurrent checks share one call ([`coalesce`]);
//! 8. **slots** ([`slots`]): in-flight slots of `max_in_flight` policies;
//! 9. **admit**: forward upstream with the quota headers.
//!
//! A phase returns `Result<_, Reply>` (or an admission decided early), so a
//! request leaves the spine with `?` at the phase that answered it, and the host
//! gets `Result<Admit, Reply>` ([`Decided`]) plus the work to finish after
//! answering (refunds, refills, late replies, refreshes).
//!
//! Every store call goes through its store's circuit breaker and answer deadline
//! ([`guarded`]): a request never waits longer than that for one call, and a
//! call that misses it keeps running in the background. Redis itself refuses a
//! bucket check it runs after the instance stopped waiting (the instant is passed
//! in Redis' clock, see [`offset`]), and a late reply that admitted a request the
//! client was refused is refunded, so a refused request costs no quota. What the
//! instance tells about itself is [`health`]; how it counts decisions,
//! [`counting`].

mod answer;
pub mod blocklists;
pub mod caller;
pub mod calls_out;
pub mod check;
pub mod coalesce;
pub mod copies;
pub mod counting;
pub mod events;
pub mod guarded;
pub mod health;
pub mod lane;
pub mod leases;
pub mod leasing;
pub mod limits;
pub mod offset;
mod records;
pub mod revision;
mod settings;
pub mod slots;
mod tally;
pub mod throttled;
mod unseen;

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use floodgate_shared::time::{Clock, Micros};

pub use self::answer::{Admit, DEGRADED_HEADER, Reply, Slot};
use self::check::Undecided;
pub use self::events::{LogEvent, StoreRole};
use self::guarded::Guarded;
pub use self::health::Health;
use self::health::Totals;
use self::lane::Lane;
use self::leases::Leases;
use self::offset::OffsetBound;
use self::records::{Records, UnknownKeyBudget};
pub use self::settings::{PipelineConfig, store_deadline, transport_deadline};
use self::slots::{Held, SlotIds};
use self::throttled::ThrottleMemory;
use crate::breaker::Breaker;
use crate::deadline::DeadlineSettings;
use crate::fallback::LocalBuckets;
use crate::stats::{Outcome, Stats};
use crate::store::{MaybeSend, MaybeSync, Store};

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
    /// Forward upstream, or answer now.
    pub gate: Result<Admit, Reply>,
    /// Tasks the host runs after answering (never on the request's path).
    pub background: Vec<Task>,
}

/// The pipeline over a store `S` (RESP, REST or Cluster) and a clock `C`.
pub struct Pipeline<S, C> {
    clock: C,
    settings: PipelineConfig,
    /// The global store (every exact decision, records, slots, statistics).
    global: Guarded<S>,
    /// A regional store holding the region's tally, behind its own breaker (a
    /// regional outage sends bounded requests to the exact path).
    regional: Option<Guarded<S>>,
    records: Arc<Records>,
    unknown_keys: UnknownKeyBudget,
    stats: Arc<Stats>,
    totals: Arc<Totals>,
    throttled: ThrottleMemory,
    /// The first instant a request needed the configuration.
    first_read: Mutex<Option<Micros>>,
    local: LocalBuckets,
    offset: OffsetBound,
    slot_ids: SlotIds,
    leases: Arc<Leases>,
    /// Identical concurrent exact checks, decided by one call.
    coalescer: coalesce::Coalescer,
    /// The last epoch this instance tried to settle its region's tally in
    /// ([`tally`]).
    tally_settle_tried: std::sync::atomic::AtomicI64,
    /// When this instance last scanned its region's record copies ([`copies`]).
    copies_scanned: copies::ScanClock,
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    pub fn new(store: S, clock: C, settings: PipelineConfig) -> Self {
        let (stats, totals) = (Arc::new(Stats::default()), Arc::new(Totals::default()));
        let global = Self::guarded(
            &settings,
            store,
            settings.deadline,
            StoreRole::Global,
            &stats,
            &totals,
        );
        Self {
            records: Arc::new(Records::new(
                settings.cache_ttl,
                settings.negative_cache_ttl,
                settings.records_max_age,
                settings.max_cached_keys,
            )),
            unknown_keys: UnknownKeyBudget::new(
                settings.unknown_keys_per_ip_per_min,
                settings.unknown_keys_per_min,
            ),
            throttled: ThrottleMemory::default(),
            first_read: Mutex::new(None),
            local: LocalBuckets::default(),
            offset: OffsetBound::default(),
            slot_ids: SlotIds::new(clock.now()),
            leases: Arc::new(Leases::new(settings.leases, clock.now(), false)),
            regional: None,
            coalescer: coalesce::Coalescer::default(),
            tally_settle_tried: std::sync::atomic::AtomicI64::new(i64::MIN),
            copies_scanned: copies::ScanClock::default(),
            global,
            stats,
            totals,
            clock,
            settings,
        }
    }

    fn guarded(
        settings: &PipelineConfig,
        store: S,
        deadline: DeadlineSettings,
        role: StoreRole,
        stats: &Arc<Stats>,
        totals: &Arc<Totals>,
    ) -> Guarded<S> {
        let breaker = Breaker::new(settings.breaker_threshold, settings.breaker_cool_down);
        // the global store may be far: until it first answers, its calls wait
        // the start-up wait (a regional store is next door)
        let first_wait = match role {
            StoreRole::Global => settings.startup_wait,
            StoreRole::Regional => 0,
        };
        let lane = Lane::new(breaker, deadline).with_first_wait(first_wait);
        Guarded::new(
            store,
            lane,
            role,
            settings.log,
            stats.clone(),
            totals.clone(),
        )
    }

    /// Decides bounded policies at a regional store's tally (one regional round
    /// trip for a request whose tokens this instance has not drawn) instead of
    /// this instance's own leases.
    pub fn with_regional(self, store: S) -> Self {
        let deadline = self.settings.deadline;
        self.with_regional_within(store, deadline)
    }

    /// [`Pipeline::with_regional`], the regional store's deadline with its own
    /// settings (another server, maybe another protocol).
    pub fn with_regional_within(mut self, store: S, deadline: DeadlineSettings) -> Self {
        let role = StoreRole::Regional;
        let regional = Self::guarded(
            &self.settings,
            store,
            deadline,
            role,
            &self.stats,
            &self.totals,
        );
        self.regional = Some(regional);
        // the tokens this instance holds are drawn from the region's tally now
        self.leases = Arc::new(Leases::new(self.settings.leases, self.clock.now(), true));
        self
    }

    /// Counts every stats field into `sink` as well (the instance's Prometheus
    /// metrics natively), as it is counted.
    pub fn with_stats_sink(self, sink: Arc<dyn crate::stats::StatsSink>) -> Self {
        self.stats.set_sink(sink);
        self
    }

    /// The store calls out now (see [`calls_out`]).
    pub fn calls_out(&self) -> Arc<calls_out::CallsOut> {
        self.totals.calls_out.clone()
    }

    /// The global store.
    pub fn store(&self) -> &S {
        &self.global.store
    }

    pub fn settings(&self) -> &PipelineConfig {
        &self.settings
    }

    /// Decides what happens to one request.
    pub async fn gate(&self, req: RequestHead<'_>) -> Decided {
        let mut background = vec![];
        let gate = self.phases(&req, &mut background, true).await;
        Decided { gate, background }
    }

    /// The request's way through the edge, phase by phase. `again`: a check that
    /// finds the key's record stale (its credits moved, [`check::Undecided::Moved`])
    /// reads the record anew and decides once more.
    async fn phases(
        &self,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
        again: bool,
    ) -> Result<Admit, Reply> {
        let secret = caller::credentials(req, self.settings.bearer)?;
        if again && let Some(answer) = Box::pin(self.unseen(secret, req, later)).await {
            return answer;
        }
        let caller = match self.caller(secret, req, later).await {
            Ok(c) => c,
            Err(unverified) => return unverified,
        };
        self.blocked(&caller.config, &caller.record, req)?;
        let limits = self.limits(&caller.config, caller.record, req, caller.at)?;
        if limits.policies.is_empty() && limits.record.credits.is_none() {
            // a plan without policies: admitted, and counted like any decision
            self.count(&limits, Outcome::Allowed, None);
            return Ok(Admit::caller(
                &limits.record,
                limits.route_name(),
                vec![],
                vec![],
            ));
        }
        // credits are always exact: a key with credits never takes a lease
        if limits.record.credits.is_none()
            && let Some(admit) = self.leased(&limits, later).await
        {
            return Ok(admit);
        }
        self.recently_throttled(&limits)?;
        let checked = match self.check(&limits, later).await {
            Ok(checked) => checked,
            Err(Undecided::Answered(failure_mode)) => return failure_mode,
            Err(Undecided::Moved) => return Box::pin(self.moved(secret, req, later, again)).await,
        };
        self.settle(&limits, checked, later).await
    }

    /// The answer to a request the exact check decided: its quota headers, or
    /// its 429; admitted, its in-flight slots are taken and it is counted.
    async fn settle(
        &self,
        limits: &limits::Limits<'_>,
        checked: check::Checked,
        later: &mut Vec<Task>,
    ) -> Result<Admit, Reply> {
        let headers = limits.answer_credited(&checked.verdict, checked.credits.as_ref())?;
        let latency = checked.latency;
        let mut checked = Some(checked);
        // admitted: the check is still there (only a refusal gives it back)
        let held = self.slots(limits, &mut checked, later).await?;
        self.count(limits, Outcome::Allowed, latency);
        self.count_admitted(limits, checked.as_ref().map(|c| &c.verdict));
        let admit = |slots| Admit::caller(&limits.record, limits.route_name(), headers, slots);
        Ok(match held {
            Held::Slots(slots) => admit(slots),
            Held::Unlimited => admit(vec![]).with_header(DEGRADED_HEADER, "fail-open"),
        })
    }

    /// The key's credits moved while this instance held its record (an operator
    /// changed its identity): the record is read anew and the request decided
    /// once more. A second move in a row (the change still under way) is
    /// refused like any call that could not decide a key with credits: 503,
    /// nothing spent.
    async fn moved(
        &self,
        secret: &str,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
        again: bool,
    ) -> Result<Admit, Reply> {
        self.records
            .forget_key(&floodgate_shared::apikeys::hash_secret(secret));
        if again {
            return self.phases(req, later, false).await;
        }
        Err(self.degraded_refusal(
            None,
            None,
            "the key's credits are moving to another identity",
        ))
    }
}
