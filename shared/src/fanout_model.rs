//! A model of an edge deployment at fan-out, on the pure twins (no servers):
//! hundreds of locations × a few instances each, a long tail of API keys drawn
//! from a Zipf distribution, instances (isolates) that live from seconds to
//! hours. It reports what `scripts/bench fanout` measures on real servers:
//! billed commands per request (global / regional), the share of requests that
//! waited for the global store, an estimate of the added latency from the round
//! trips on each request's path, and a hammered key's admissions against its
//! bound.
//!
//! **What is the edge's, what is approximated.** Per instance and key, the model
//! follows the edge (`edge/src/pipeline/`): the key record cache of
//! `records.rs` (fresh for a TTL after a read or a revision confirmation, read
//! again on the path when missing or older than two TTLs, in the background
//! when past its own lifetime), the sub-leases of `leases.rs` (sized from the
//! key's rate on the instance, spent in memory, drawn ahead when less than one
//! is left for a quarter of a lifetime), the regional pools and the global
//! bucket through their pure twins ([`Pool`], [`Central`]), and a refill's
//! chunk landing a global round trip later. Approximated: a regional call is
//! decided at the instant the request is (its round trip is short against the
//! global one, and is counted in the latency estimate); the draw of companion
//! keys with a key's own (one pool call for several keys) is left out, so the
//! model's regional bill is an upper bound; per-instance bookkeeping that does
//! not depend on the key (statistics flushes, revision reads, the
//! configuration's re-read) is counted from the instance's request rate, not
//! simulated; a key's traffic is spread evenly over every instance (the worst
//! case: a real tenant's callers cluster in a few locations).
//!
//! **How it stays fast.** Keys are independent in this model (everything a key
//! costs is its own record reads, sub-leases, pool and bucket), so the model
//! runs one key at a time through every request of its Poisson arrivals, on
//! per-instance state reset by a stamp rather than cleared: every request of
//! the window is simulated, a few million per row, in about a second.
//!
//! **A new mechanism** (a regional copy of key records, a cheaper cold-key
//! path, a standing allowance) is one more [`Mechanism`]: it says where a
//! missing record is read and how a request whose record is at hand is decided,
//! using the same [`KeyRun`] steps; [`RegionalRecords`] is one such, a what-if.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::lease::{Central, LeaseConfig, LocalLease, Pool, PoolAsk, RateMeter, SubLease};
use crate::time::{MICROS_PER_SEC, Micros};

/// What the edge does, in the numbers the model follows (the edge's defaults;
/// `edge/src/settings.rs`, `edge/src/pipeline/leases.rs`, `leasing.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeDefaults {
    /// Records are fresh this long after a read or a revision confirmation
    /// (`--cache-ttl-ms`).
    pub cache_ttl: Micros,
    /// A known key record is read again this long after it was read.
    pub records_max_age: Micros,
    /// Statistics are written at most this often (`--stats-flush-ms`).
    pub stats_flush_every: Micros,
    /// A regional pool chunk's life, and so a sub-lease's (`--pool-lifetime-ms`).
    pub pool_lifetime: Micros,
}

impl Default for EdgeDefaults {
    fn default() -> Self {
        Self {
            cache_ttl: 5 * MICROS_PER_SEC,
            records_max_age: 300 * MICROS_PER_SEC,
            stats_flush_every: 10 * MICROS_PER_SEC,
            pool_lifetime: 60 * MICROS_PER_SEC,
        }
    }
}

/// `leases.rs`: a sub-lease is at most this share of a pool refill...
const SUB_LEASES_PER_CHUNK: u64 = 8;
/// ...but never below this (or half a refill).
const SUB_LEASE_FLOOR: u64 = 8;
/// Requests a sub-lease's size is measured over.
const SIZING_REQUESTS: u64 = 8;
/// The most traffic a key's first sub-lease covers, before its rate is measured.
const FIRST_SUB_LEASE: Micros = 5 * MICROS_PER_SEC;
/// The chunks a region's pool may hold at once.
const CHUNKS_PER_REGION: u64 = 3;
/// `leasing.rs`: a chunk dies this long before its lease, a sub-lease before
/// its chunk.
const POOL_MARGIN: Micros = 50_000;
/// `leasing.rs`: the longest a pool's refill lock lives (ms).
const REFILL_LOCK_MAX_MS: Micros = 5_000;

/// Commands billed per call, as Upstash bills them (every command a script
/// runs, and the call itself; docs/cost.md).
pub mod billed {
    /// `lua/token_bucket.lua`: EVALSHA, TIME, MGET (buckets and the revision), SET.
    pub const EXACT_CHECK: u64 = 4;
    /// One MGET of the records a cache misses (revision, configuration, key).
    pub const RECORD_READ: u64 = 1;
    /// One GET of the records' revision.
    pub const REVISION_READ: u64 = 1;
    /// `lua/pool_take.lua` for one bucket: EVALSHA, TIME, MGET, SET.
    pub const POOL_TAKE: u64 = 4;
    /// `lua/pool_add.lua`: EVALSHA, TIME, SET.
    pub const POOL_ADD: u64 = 3;
    /// `lua/lease_take.lua` before its SETs: EVALSHA, TIME, MGET.
    pub const LEASE_TAKE_BASE: u64 = 3;
    /// `lua/stats_flush.lua` per flush: EVALSHA, HSET, LPUSH...
    pub const STATS_FLUSH: u64 = 3;
    /// ...and per minute an instance was active: EXPIRE, the last-use HSET.
    pub const STATS_PER_MINUTE: u64 = 2;
}

/// One rate limit: `capacity` tokens, `refill` tokens per `period`, at most
/// `max_overshoot` tokens beyond the bucket (bounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub capacity: u64,
    pub refill: u64,
    pub period: Micros,
    pub max_overshoot: u64,
}

impl Limit {
    fn emission(&self) -> Micros {
        self.period / self.refill.max(1) as Micros
    }

    fn burst(&self) -> Micros {
        self.capacity as Micros * self.emission()
    }

    /// `LeaseSettings::credit`: what a region admits unconfirmed.
    fn credit(&self, regions: u32) -> u64 {
        self.max_overshoot / (4 * u64::from(regions.max(1)))
    }

    /// What the global store leases: the bound less the regions' credit.
    fn leasable(&self, regions: u32) -> u64 {
        self.max_overshoot - u64::from(regions.max(1)) * self.credit(regions)
    }

    /// `LeaseSettings::pool_target`: one pool refill.
    fn pool_target(&self, regions: u32) -> u64 {
        (self.leasable(regions) / (CHUNKS_PER_REGION * u64::from(regions.max(1)))).max(1)
    }

    /// `LeaseSettings::sub_lease_for`: half a `lifetime` of `tokens` over `over`.
    fn sub_lease_for(&self, regions: u32, lifetime: Micros, tokens: u64, over: Micros) -> u64 {
        let target = self.pool_target(regions);
        let max = (target / SUB_LEASES_PER_CHUNK)
            .max(SUB_LEASE_FLOOR.min(target / 2))
            .max(1);
        let half = (u128::from(tokens) * lifetime as u128 / 2 / over.max(1) as u128) as u64;
        half.clamp(1, max)
    }
}

/// The deployment and load of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub locations: usize,
    pub instances_per_location: usize,
    /// Regional stores (pools); location l is in region l mod regions.
    pub regions: u32,
    pub keys: usize,
    /// The Zipf exponent of the keys' shares of the traffic.
    pub zipf: f64,
    /// Requests per second, all keys together.
    pub rate: f64,
    /// How long an instance lives before it is replaced by a cold one.
    pub lifetime: Micros,
    pub global_one_way: Micros,
    pub regional_round_trip: Micros,
    pub limit: Limit,
    pub edge: EdgeDefaults,
    /// Simulated before the measured window (the caches fill), then measured.
    pub warm: Micros,
    pub measured: Micros,
    pub seed: u64,
}

impl Deployment {
    fn instances(&self) -> usize {
        self.locations * self.instances_per_location
    }

    fn region_of(&self, instance: usize) -> usize {
        (instance / self.instances_per_location) % self.regions.max(1) as usize
    }

    /// Instance `i`'s incarnation at `at` (its lifetimes are staggered).
    fn incarnation(&self, i: usize, at: Micros) -> u32 {
        let life = self.lifetime.max(1);
        let phase = (splitmix(i as u64 ^ self.seed) % life as u64) as Micros;
        ((at + phase) / life) as u32
    }

    /// Requests per second one instance sees.
    fn per_instance(&self) -> f64 {
        self.rate / self.instances().max(1) as f64
    }
}

/// What one row found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub requests: u64,
    pub admitted: u64,
    pub global: f64,
    pub regional: f64,
    /// Requests with at least one global round trip on their path.
    pub waited_global: u64,
    /// Requests by the added latency their round trips make (µs).
    pub latency: BTreeMap<Micros, u64>,
    /// Of the global bill: per-instance bookkeeping (statistics, revision and
    /// configuration reads), counted from the instances' request rate.
    pub bookkeeping: f64,
}

impl Figures {
    pub fn billed_per_request(&self) -> f64 {
        (self.global + self.regional) / self.requests.max(1) as f64
    }

    pub fn global_per_request(&self) -> f64 {
        self.global / self.requests.max(1) as f64
    }

    pub fn regional_per_request(&self) -> f64 {
        self.regional / self.requests.max(1) as f64
    }

    pub fn share_waited(&self) -> f64 {
        self.waited_global as f64 / self.requests.max(1) as f64
    }

    /// The `q` quantile of the added latency (ms).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let want = ((self.requests as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (us, n) in &self.latency {
            seen += n;
            if seen >= want {
                return *us as f64 / 1e3;
            }
        }
        0.0
    }
}

/// Where a missing key record is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordSource {
    /// The global store (today's edge).
    Global,
    /// A copy in the region's store.
    Regional,
    /// Copies in the region's store loaded whole at an instance's start: no read
    /// per key.
    RegionalBulk,
    /// A key the instance never read is read in its exact check's own call
    /// (`edge/src/pipeline/unseen.rs`: no read, no round trip of its own); read
    /// again at the global store past its lifetime.
    WithCheck,
}

/// How a mode decides: where records come from, and how a request whose record
/// is at hand is decided (with the steps of [`KeyRun`]).
pub trait Mechanism {
    fn name(&self) -> String;
    fn records(&self) -> RecordSource {
        RecordSource::Global
    }
    /// Whether decisions confirm the records' revision at no cost (an exact
    /// check's MGET carries it); otherwise each instance reads it once per TTL.
    fn confirms_revision(&self) -> bool {
        false
    }
    /// Decides one request at `at` on `instance`: admitted or not.
    fn decide(&self, run: &mut KeyRun<'_>, at: Micros, instance: usize, trip: &mut Trip) -> bool;
}

/// Exact: every request is one script call at the global store.
pub struct Exact;

impl Mechanism for Exact {
    fn name(&self) -> String {
        "exact".into()
    }
    fn confirms_revision(&self) -> bool {
        true
    }
    fn records(&self) -> RecordSource {
        RecordSource::WithCheck
    }
    fn decide(&self, run: &mut KeyRun<'_>, at: Micros, _: usize, trip: &mut Trip) -> bool {
        run.exact_check(at, trip)
    }
}

/// Bounded with regional pools and sub-leases, as the edge decides today.
pub struct Bounded;

impl Mechanism for Bounded {
    fn name(&self) -> String {
        "bounded".into()
    }
    fn decide(&self, run: &mut KeyRun<'_>, at: Micros, instance: usize, trip: &mut Trip) -> bool {
        run.bounded(at, instance, trip)
    }
}

/// What-if (not built): [`Bounded`] with key records read from a copy in the
/// region's store instead of the global one.
pub struct RegionalRecords;

impl Mechanism for RegionalRecords {
    fn name(&self) -> String {
        "bounded + regional records (what-if)".into()
    }
    fn records(&self) -> RecordSource {
        RecordSource::Regional
    }
    fn decide(&self, run: &mut KeyRun<'_>, at: Micros, instance: usize, trip: &mut Trip) -> bool {
        run.bounded(at, instance, trip)
    }
}

/// What-if: a cold key (not hot on its instance) is decided by ONE plain
/// command at its region's store — `HINCRBY` of the key's count in the
/// region's ledger, admitted while the count stays within the region's share
/// of the bound — and the ledger is charged to the global buckets once per
/// settle interval (one `SET` per key with a count, the rest amortized over
/// every key); hot keys keep their sub-leases. Records come from a copy in
/// the region (bulk-loaded: no read per key).
pub struct Ledger {
    /// How often a region's ledger is charged to the global store.
    pub settle_every: Micros,
    /// A key this many requests a second on an instance takes sub-leases.
    pub hot_per_sec: u64,
}

impl Mechanism for Ledger {
    fn name(&self) -> String {
        format!(
            "ledger (what-if): settled every {} s, sub-leases from {}/s",
            self.settle_every / MICROS_PER_SEC,
            self.hot_per_sec
        )
    }
    fn records(&self) -> RecordSource {
        RecordSource::RegionalBulk
    }
    fn decide(&self, run: &mut KeyRun<'_>, at: Micros, instance: usize, trip: &mut Trip) -> bool {
        run.ledger(self, at, instance, trip)
    }
}

/// A region's ledger of one key: the settle interval it counts in, its count,
/// and until when the key is blocked (its global bucket in debt).
#[derive(Debug, Clone, Copy, Default)]
struct LedgerEntry {
    interval: Micros,
    count: u64,
    blocked_until: Micros,
}

/// The round trips on one request's path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trip {
    pub global: u32,
    pub regional: u32,
}

/// One key's state on one instance (`leases.rs`' `Held`, with the key's record).
#[derive(Debug, Clone, Default)]
struct Held {
    /// Valid for this key's run and this incarnation of the instance only.
    stamp: u32,
    incarnation: u32,
    record_read_at: Option<Micros>,
    leases: Vec<LocalLease>,
    refilling: bool,
    sub_retry_at: Micros,
    sub_size: u64,
    sub_size_at: Micros,
    seen: u64,
    meter: RateMeter,
    done: Vec<(String, u64)>,
}

impl Held {
    fn at_hand(&self, at: Micros) -> u64 {
        self.leases
            .iter()
            .filter(|l| l.live(at))
            .map(|l| l.tokens)
            .sum()
    }

    /// Drops the sub-leases past their life: reported done.
    fn drop_dead(&mut self, at: Micros) {
        let done = &mut self.done;
        self.leases.retain(|l| {
            if !l.live(at) {
                done.push((l.member.clone(), l.granted));
            }
            l.live(at)
        });
    }

    /// `Held::spend` of one token: from the sub-lease expiring first; one spent
    /// out is reported done (every sub-lease held has a token left).
    fn spend(&mut self, at: Micros) -> bool {
        self.drop_dead(at);
        let first = (0..self.leases.len()).min_by_key(|&j| self.leases[j].until);
        let Some(j) = first else {
            return false;
        };
        self.leases[j].tokens -= 1;
        if self.leases[j].tokens == 0 {
            let l = self.leases.swap_remove(j);
            self.done.push((l.member, l.granted));
        }
        true
    }

    /// `Held::sub_size`.
    fn sub_size(&mut self, limit: &Limit, regions: u32, lifetime: Micros, at: Micros) -> u64 {
        let elapsed = at - self.sub_size_at;
        if self.sub_size == 0 {
            let per_sec = self.meter.per_sec(at);
            let first = lifetime.min(2 * FIRST_SUB_LEASE);
            self.sub_size = limit.sub_lease_for(regions, first, per_sec, MICROS_PER_SEC);
            (self.sub_size_at, self.seen) = (at, 0);
        } else if elapsed >= MICROS_PER_SEC
            && (self.seen >= SIZING_REQUESTS || elapsed >= lifetime / 2)
        {
            self.sub_size = limit.sub_lease_for(regions, lifetime, self.seen, elapsed);
            (self.sub_size_at, self.seen) = (at, 0);
        }
        self.sub_size
    }

    /// `Leases::sub_leased`.
    fn sub_leased(&mut self, parts: &[SubLease], sent: Micros, lifetime: Micros) {
        self.refilling = false;
        match parts.iter().map(|p| p.life).max() {
            None => self.sub_retry_at = sent + lifetime / 8,
            Some(life) if life <= lifetime / 4 => self.sub_retry_at = sent + life,
            Some(_) => {}
        }
        self.leases.extend(parts.iter().map(|p| LocalLease {
            member: p.chunk.clone(),
            tokens: p.tokens,
            granted: p.tokens,
            until: sent + p.life,
        }));
    }
}

/// Work in flight to the global store and back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Work {
    /// A pool refill's lease take reaches the global store.
    Take {
        region: usize,
        id: String,
        charge: u64,
        retire: String,
    },
    /// Its chunk reaches the pool (`lua/pool_add.lua`).
    Add {
        region: usize,
        member: String,
        tokens: u64,
        life: Micros,
        charged: u64,
        clear: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Due {
    at: Micros,
    seq: u64,
    work: Work,
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One key's run through a deployment: its global bucket, its regional pools,
/// its state on every instance, its work in flight, and what it billed.
pub struct KeyRun<'a> {
    d: &'a Deployment,
    limit: Limit,
    stamp: u32,
    held: Vec<Held>,
    central: Central,
    pools: Vec<Pool>,
    ledgers: Vec<LedgerEntry>,
    due: BinaryHeap<Reverse<Due>>,
    seq: u64,
    /// Billed so far (global, regional) within the measured window.
    global: u64,
    regional: u64,
    window: (Micros, Micros),
}

impl<'a> KeyRun<'a> {
    fn new(d: &'a Deployment, limit: Limit, window: (Micros, Micros)) -> Self {
        Self {
            d,
            limit,
            stamp: 0,
            held: vec![Held::default(); d.instances()],
            central: Central::default(),
            pools: vec![Pool::default(); d.regions.max(1) as usize],
            ledgers: vec![LedgerEntry::default(); d.regions.max(1) as usize],
            due: BinaryHeap::new(),
            seq: 0,
            global: 0,
            regional: 0,
            window,
        }
    }

    /// Starts the next key: every instance's state of the last one is void.
    fn next_key(&mut self, limit: Limit) {
        self.stamp += 1;
        self.limit = limit;
        self.central = Central::default();
        self.pools.iter_mut().for_each(|p| *p = Pool::default());
        self.ledgers
            .iter_mut()
            .for_each(|l| *l = LedgerEntry::default());
        self.due.clear();
    }

    fn bill(&mut self, at: Micros, global: u64, regional: u64) {
        if at >= self.window.0 && at < self.window.1 {
            self.global += global;
            self.regional += regional;
        }
    }

    /// This key's state on instance `i` at `at` (a new incarnation starts cold).
    fn held(&mut self, i: usize, at: Micros) -> &mut Held {
        let incarnation = self.d.incarnation(i, at);
        let h = &mut self.held[i];
        if h.stamp != self.stamp || h.incarnation != incarnation {
            *h = Held {
                stamp: self.stamp,
                incarnation,
                ..Held::default()
            };
        }
        h
    }

    /// Runs the global store's and the pools' work due by `at`.
    fn run_due(&mut self, at: Micros) {
        while self.due.peek().is_some_and(|Reverse(d)| d.at <= at) {
            let Reverse(d) = self.due.pop().expect("peeked");
            self.run_work(d.at, d.work);
        }
    }

    fn schedule(&mut self, at: Micros, work: Work) {
        self.seq += 1;
        let seq = self.seq;
        self.due.push(Reverse(Due { at, seq, work }));
    }

    fn run_work(&mut self, at: Micros, work: Work) {
        let ow = self.d.global_one_way;
        match work {
            Work::Take {
                region,
                id,
                charge,
                retire,
            } => {
                let (regions, limit) = (self.d.regions, self.limit);
                let want = limit.pool_target(regions);
                let cfg = LeaseConfig {
                    max_overshoot: limit.leasable(regions),
                    max_lease: want,
                    lifetime: self.d.edge.pool_lifetime,
                    ..LeaseConfig::default()
                };
                let (burst, t) = (limit.burst(), limit.emission());
                let taken = self.central.take_charging(
                    &cfg,
                    at,
                    burst,
                    t,
                    charge,
                    want,
                    &id,
                    Some(retire.as_str()),
                    true,
                );
                let sets = u64::from(charge + taken.leased > 0)
                    + u64::from(taken.leased > 0 || !retire.is_empty());
                self.bill(at, billed::LEASE_TAKE_BASE + sets, 0);
                let life = cfg.lifetime - 2 * ow - POOL_MARGIN;
                let (member, tokens) = if taken.leased > 0 && life > 0 {
                    (taken.member(&id, t), taken.leased)
                } else {
                    (String::new(), 0)
                };
                let clear = taken.full_at - taken.now <= burst;
                let add = Work::Add {
                    region,
                    member,
                    tokens,
                    life: life.max(0),
                    charged: charge,
                    clear,
                };
                self.schedule(at + ow, add);
            }
            Work::Add {
                region,
                member,
                tokens,
                life,
                charged,
                clear,
            } => {
                self.pools[region].add(&member, tokens, life, charged, clear, at);
                self.bill(at, 0, billed::POOL_ADD);
            }
        }
    }

    /// The key's record on `instance` (`records.rs`): read on the path when
    /// missing or old, in the background when past its lifetime but stale.
    fn record(&mut self, at: Micros, i: usize, source: RecordSource, old: bool, trip: &mut Trip) {
        let (ttl, max_age) = (self.d.edge.cache_ttl, self.d.edge.records_max_age);
        let h = self.held(i, at);
        let on_path = match h.record_read_at {
            None => true,
            Some(read) if at >= read + max_age => at >= read + max_age + ttl || old,
            Some(_) => old,
        };
        let background = !on_path && h.record_read_at.is_some_and(|r| at >= r + max_age);
        if on_path || background {
            let first = h.record_read_at.is_none();
            h.record_read_at = Some(at);
            match source {
                RecordSource::WithCheck if first => {}
                RecordSource::Global | RecordSource::WithCheck => {
                    trip.global += u32::from(on_path);
                    self.bill(at, billed::RECORD_READ, 0);
                }
                RecordSource::Regional => {
                    trip.regional += u32::from(on_path);
                    self.bill(at, 0, billed::RECORD_READ);
                }
                RecordSource::RegionalBulk => {}
            }
        }
    }

    /// An exact decision at the global store (`lua/token_bucket.lua`).
    pub fn exact_check(&mut self, at: Micros, trip: &mut Trip) -> bool {
        trip.global += 1;
        self.bill(at, billed::EXACT_CHECK, 0);
        let (burst, t) = (self.limit.burst(), self.limit.emission());
        let cfg = LeaseConfig::default();
        self.central
            .take(&cfg, at, burst, t, 1, 0, "exact", None)
            .admitted
    }

    /// A bounded decision (`leasing.rs`' `try_leased` with a regional store):
    /// spent from the instance's sub-leases (drawing more ahead in the
    /// background), else at the region's pool on the path, else exact.
    pub fn bounded(&mut self, at: Micros, i: usize, trip: &mut Trip) -> bool {
        let h = self.held(i, at);
        h.seen += 1;
        h.meter.record(at, 1);
        if h.spend(at) {
            if self.sub_due(at, i) {
                self.pool_take(at, i, 0);
            }
            return true;
        }
        trip.regional += 1;
        if self.pool_take(at, i, 1) {
            return true;
        }
        self.exact_check(at, trip)
    }

    /// [`Ledger`]'s decision: sub-leases for a key hot on the instance, else one
    /// `HINCRBY` at the region's ledger (within its share of the bound), else
    /// exact.
    fn ledger(&mut self, l: &Ledger, at: Micros, i: usize, trip: &mut Trip) -> bool {
        let h = self.held(i, at);
        let hot = h.meter.per_sec(at) >= l.hot_per_sec || !h.leases.is_empty();
        if hot {
            return self.bounded(at, i, trip);
        }
        let h = self.held(i, at);
        h.seen += 1;
        h.meter.record(at, 1);
        let region = self.d.region_of(i);
        self.settle(region, at, l.settle_every);
        let share = (self.limit.max_overshoot / (8 * u64::from(self.d.regions.max(1)))).max(1);
        let entry = self.ledgers[region];
        if entry.blocked_until > at {
            return self.exact_check(at, trip);
        }
        if entry.count >= share {
            // busy in the region this interval: its pool decides
            return self.bounded(at, i, trip);
        }
        trip.regional += 1;
        self.bill(at, 0, 1);
        self.ledgers[region].count += 1;
        true
    }

    /// Charges `region`'s ledger of this key to the global bucket when its
    /// settle interval has passed (one SET; into debt, which blocks the key in
    /// the region until the bucket is out of it).
    fn settle(&mut self, region: usize, at: Micros, every: Micros) {
        let interval = at / every;
        let entry = self.ledgers[region];
        if entry.interval == interval {
            return;
        }
        let settled_at = interval * every;
        if entry.count > 0 {
            self.bill(settled_at, 1, 0);
            let (burst, t) = (self.limit.burst(), self.limit.emission());
            let base = self.central.full_at.max(settled_at);
            self.central.full_at = base + entry.count as Micros * t;
            if self.central.full_at - settled_at > burst {
                self.ledgers[region].blocked_until = self.central.full_at - burst;
            }
        }
        self.ledgers[region].interval = interval;
        self.ledgers[region].count = 0;
    }

    /// `Leases::sub_due` (share 1): less than a sub-lease at hand for a
    /// quarter of a lifetime, no draw in flight or paused; marks one in flight.
    fn sub_due(&mut self, at: Micros, i: usize) -> bool {
        let (limit, regions, lifetime) = (self.limit, self.d.regions, self.d.edge.pool_lifetime);
        let h = self.held(i, at);
        let size = h.sub_size(&limit, regions, lifetime, at);
        if at < h.sub_retry_at || h.refilling || h.at_hand(at + lifetime / 4) >= size {
            return false;
        }
        h.refilling = true;
        true
    }

    /// One `lua/pool_take.lua` call of `cost` for instance `i`'s region, its
    /// sub-lease held by the instance, a refill started when it was asked
    /// for: whether the pool admitted.
    fn pool_take(&mut self, at: Micros, i: usize, cost: u64) -> bool {
        let (limit, regions, lifetime) = (self.limit, self.d.regions, self.d.edge.pool_lifetime);
        let region = self.d.region_of(i);
        let h = self.held(i, at);
        h.drop_dead(at);
        let want = h.sub_size(&limit, regions, lifetime, at);
        let ask = PoolAsk {
            cost,
            low: limit.pool_target(regions) / 2 + 1,
            credit: limit.credit(regions),
            want,
            done: std::mem::take(&mut h.done),
        };
        let lock = (lifetime / 2_000).clamp(1, REFILL_LOCK_MAX_MS) * 1_000;
        let ahead = lifetime / 4 + POOL_MARGIN;
        let taken = Pool::take_ahead(
            &mut [&mut self.pools[region]],
            &[ask],
            at,
            lock,
            POOL_MARGIN,
            ahead,
        );
        self.bill(at, 0, billed::POOL_TAKE);
        self.held(i, at).sub_leased(&taken.leases[0], at, lifetime);
        if taken.refill[0] {
            self.seq += 1;
            let take = Work::Take {
                region,
                id: self.seq.to_string(),
                charge: taken.unconfirmed[0],
                retire: taken.retire[0].join(" "),
            };
            self.schedule(at + self.d.global_one_way, take);
        }
        taken.admitted
    }

    /// One request: its record, then its decision; the round trips it waited.
    fn request(&mut self, mode: &dyn Mechanism, at: Micros, i: usize, old: bool) -> (bool, Trip) {
        self.run_due(at);
        let mut trip = Trip::default();
        self.record(at, i, mode.records(), old, &mut trip);
        let admitted = mode.decide(self, at, i, &mut trip);
        (admitted, trip)
    }
}

/// SplitMix64: a small deterministic generator (the model is pure).
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Runs `mode` over `d`: every request of every key in the window.
pub fn run(d: &Deployment, mode: &dyn Mechanism) -> Figures {
    let end = d.warm + d.measured;
    let window = (d.warm, end);
    let mut run = KeyRun::new(d, d.limit, window);
    let mut rng = Rng(d.seed);
    let norm: f64 = (1..=d.keys).map(|k| (k as f64).powf(-d.zipf)).sum();
    let old = old_share(d, mode);
    let mut f = Figures::default();
    for k in 1..=d.keys {
        let rate = d.rate * (k as f64).powf(-d.zipf) / norm;
        run.next_key(d.limit);
        let mut at = 0.0;
        loop {
            at += -rng.unit().ln() / rate * MICROS_PER_SEC as f64;
            if at >= end as f64 {
                break;
            }
            let (t, i) = (at as Micros, rng.below(d.instances()));
            let is_old = old > 0.0 && rng.unit() < old;
            let (admitted, trip) = run.request(mode, t, i, is_old);
            if t >= d.warm {
                tally(&mut f, d, admitted, trip);
            }
        }
    }
    f.global = run.global as f64;
    f.regional = run.regional as f64;
    f.bookkeeping = bookkeeping_per_sec(d, mode) * d.measured as f64 / MICROS_PER_SEC as f64;
    f.global += f.bookkeeping;
    f
}

fn tally(f: &mut Figures, d: &Deployment, admitted: bool, trip: Trip) {
    f.requests += 1;
    f.admitted += u64::from(admitted);
    f.waited_global += u64::from(trip.global > 0);
    let added = Micros::from(trip.global) * 2 * d.global_one_way
        + Micros::from(trip.regional) * d.regional_round_trip;
    *f.latency.entry(added).or_default() += 1;
}

/// The chance a known, unexpired record is found old: its instance's records
/// were last confirmed more than two TTLs ago, which takes a gap of about a TTL
/// in the instance's traffic (each request after a TTL checks the revision).
fn old_share(d: &Deployment, _mode: &dyn Mechanism) -> f64 {
    let ttl = d.edge.cache_ttl as f64 / MICROS_PER_SEC as f64;
    (-d.per_instance() * ttl).exp()
}

/// Global commands per second of per-instance bookkeeping, all instances:
/// statistics flushes (one per flush interval while there is something new,
/// and per active minute), the revision read once per TTL when decisions do not
/// confirm it, the configuration read again once per `records_max_age`.
fn bookkeeping_per_sec(d: &Deployment, mode: &dyn Mechanism) -> f64 {
    let rho = d.per_instance().max(1e-9);
    let secs = |m: Micros| m as f64 / MICROS_PER_SEC as f64;
    let flushes = 1.0 / (secs(d.edge.stats_flush_every) + 1.0 / rho);
    let minutes = (1.0 - (-60.0 * rho).exp()) / 60.0;
    let stats = billed::STATS_FLUSH as f64 * flushes + billed::STATS_PER_MINUTE as f64 * minutes;
    let revision = if mode.confirms_revision() {
        0.0
    } else {
        billed::REVISION_READ as f64 / (secs(d.edge.cache_ttl) + 1.0 / rho)
    };
    let config = billed::RECORD_READ as f64 / secs(d.edge.records_max_age);
    d.instances() as f64 * (stats + revision + config)
}

/// What a hammered key admits: every instance sends `each` requests within one
/// second, all at once, against `quota` (not refilling) in `mode`. The bound
/// holds when this is at most capacity + max_overshoot (bounded) or capacity
/// (exact).
pub fn hammered(d: &Deployment, mode: &dyn Mechanism, quota: Limit, each: usize) -> u64 {
    let mut run = KeyRun::new(d, quota, (0, Micros::MAX));
    run.next_key(quota);
    let mut rng = Rng(d.seed ^ 0x4841_4d4d);
    let mut arrivals: Vec<(Micros, usize)> = (0..d.instances())
        .flat_map(|i| (0..each).map(move |_| i))
        .map(|i| ((rng.unit() * MICROS_PER_SEC as f64) as Micros, i))
        .collect();
    arrivals.sort_unstable();
    let mut admitted = 0;
    for (at, i) in arrivals {
        admitted += u64::from(run.request(mode, at, i, false).0);
    }
    admitted
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOAD: Limit = Limit {
        capacity: 10_000,
        refill: 10_000,
        period: 60 * MICROS_PER_SEC,
        max_overshoot: 500,
    };

    const QUOTA: Limit = Limit {
        capacity: 400,
        refill: 1,
        period: 3_600 * MICROS_PER_SEC,
        max_overshoot: 40,
    };

    fn deployment(locations: usize, per_location: usize, keys: usize) -> Deployment {
        Deployment {
            locations,
            instances_per_location: per_location,
            regions: 2,
            keys,
            zipf: 1.1,
            rate: 200.0,
            lifetime: 3_600 * MICROS_PER_SEC,
            global_one_way: 50_000,
            regional_round_trip: 1_000,
            limit: LOAD,
            edge: EdgeDefaults::default(),
            warm: 30 * MICROS_PER_SEC,
            measured: 30 * MICROS_PER_SEC,
            seed: 7,
        }
    }

    /// One instance with one hot key bills a fraction of a command per request
    /// and never waits for the global store once warm; 1,200 instances over
    /// 10,000 cold keys bill more than exact's 4 and wait on most requests.
    #[test]
    fn one_hot_instance_bills_less_than_many_cold_ones() {
        let hot = run(&deployment(1, 1, 1), &Bounded);
        let cold = run(&deployment(300, 4, 10_000), &Bounded);
        assert!(hot.billed_per_request() < 1.0, "{hot:?}");
        assert_eq!(hot.waited_global, 0);
        assert!(
            cold.billed_per_request() > 10.0 * hot.billed_per_request(),
            "{} vs {}",
            cold.billed_per_request(),
            hot.billed_per_request()
        );
        assert!(cold.share_waited() > 0.5, "{}", cold.share_waited());
        let exact = run(&deployment(1, 1, 1), &Exact);
        assert!(exact.global_per_request() >= 4.0, "{exact:?}");
        assert_eq!(exact.share_waited(), 1.0);
    }

    /// A quota of 400 (not refilling) with a bound of 40, hammered from every
    /// instance: bounded admits at most 440, exact at most 400, and neither
    /// admits far less (a shortfall is allowed, not a collapse).
    #[test]
    fn the_hammered_key_stays_within_its_bound() {
        for (locations, per_location) in [(1, 4), (2, 24), (300, 4)] {
            let d = Deployment {
                regions: 6,
                ..deployment(locations, per_location, 1)
            };
            let each = 1_000usize.div_ceil(d.instances());
            let bounded = hammered(&d, &Bounded, QUOTA, each);
            assert!((300..=440).contains(&bounded), "{locations}: {bounded}");
            assert_eq!(hammered(&d, &Exact, QUOTA, each), 400);
        }
    }

    /// Prints the model's figures for a few mechanisms (`cargo test -p
    /// floodgate-shared fanout -- --ignored --nocapture`): a quick look while
    /// designing, not a check.
    #[test]
    #[ignore]
    fn print_the_ledger_what_if() {
        for (n, keys, zipf) in [
            (4, 400, 1.1),
            (16, 400, 1.1),
            (48, 400, 1.1),
            (48, 1_000, 0.9),
        ] {
            let mut d = deployment(n, 1, keys);
            d.zipf = zipf;
            d.measured = 60 * MICROS_PER_SEC;
            for hot in [2, 5, 1_000] {
                let l = Ledger {
                    settle_every: 10 * MICROS_PER_SEC,
                    hot_per_sec: hot,
                };
                let modes: [&dyn Mechanism; 3] = [&Bounded, &Exact, &l];
                for m in modes {
                    let f = run(&d, m);
                    println!(
                        "{n:>3} {keys:>5} {zipf}: {:<50} billed {:.2} ({:.2} + {:.2}) waited {:.1} %",
                        m.name(),
                        f.billed_per_request(),
                        f.global_per_request(),
                        f.regional_per_request(),
                        100.0 * f.share_waited()
                    );
                }
            }
        }
    }
}
