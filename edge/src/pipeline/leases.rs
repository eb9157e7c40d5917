//! Bounded consistency at the edge: requests whose policies are all `bounded` (or
//! `auto` and hot) are decided without a round trip to the global Redis.
//!
//! - **Without a regional store**, this instance spends tokens it leased from
//!   the global bucket (`lua/lease_take.lua`, cost 0), refilled ahead in the
//!   background before the last ones run out; the global Redis records every
//!   lease and refuses to lease past the policy's `max_overshoot` tokens
//!   outstanding (a lease is spent only until its global lease expires, on the
//!   holder's reckoning, which starts when the take was SENT; a crashed
//!   holder's tokens lapse: a shortfall, never an overshoot).
//! - **With a regional store**, its region's tally decides
//!   ([`floodgate_shared::tally`], [`super::tally`]): ONE `HINCRBY` next door,
//!   or nothing at all for tokens this instance drew with an earlier request.
//!   This file keeps, per bucket, what the instance drew ([`tally::Held`]). A
//!   key hot on this instance (`regional_hot_per_sec`, until it cools to
//!   `regional_cool_per_sec`) leases from the global bucket as above beside
//!   it: a tally's epoch carries at most its book of chunks, a lease is
//!   retired as soon as it is spent.
//!
//! A request with any exact (or shadow, or in-flight-limited) policy, or whose
//! bounded buckets are not decided so, is decided by the exact path: ONE global
//! call for all its policies, as before. Denials therefore always come from the
//! global bucket, with an exact Retry-After.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::bucket::{Admission, Decision};
use floodgate_shared::lease::{LeaseConfig, LocalLease, Mode, ModeSwitch, Taken};
use floodgate_shared::policy::{Consistency, Policy, Quota};
use floodgate_shared::tally::{self, Ask, Counted, Shares, TallySettings};
use floodgate_shared::time::{MICROS_PER_SEC, Micros};

use crate::bounded_map::{BoundedMap, WhenFull};
use crate::sync::lock;

/// How leases are sized and how long they live (one deployment-wide setting; the
/// bound is each policy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// An instance lease's lifetime (taken from the global store).
    pub lifetime: Micros,
    /// The regional tallies' epochs: an instance with a regional store spends
    /// what it draws until its epoch ends.
    pub tally: TallySettings,
    /// `auto` policies turn bounded for a key when this instance sees at least this
    /// many requests/s of it...
    pub hot_per_sec: u64,
    /// ...and exact again at or below this many.
    pub cool_per_sec: u64,
    /// With a regional store, a `bounded` key this many requests/s on an
    /// instance leases from the global bucket beside its region's tally...
    pub regional_hot_per_sec: u64,
    /// ...until it cools to this many.
    pub regional_cool_per_sec: u64,
}

impl Default for LeaseSettings {
    /// Instance leases live 2 s (sized by time: half a lifetime of the
    /// instance's traffic, at most half the bound; at 30 s, ten instances
    /// leasing one key of a tight bound left most of them deciding exactly at
    /// the global store, `many_instances_share_one_bound`); tallies count in
    /// epochs of 5 s; beside a tally, a key of 20 requests/s on an instance
    /// leases (a lease then holds a second of its requests for a take of five
    /// commands, about what its counts would bill, and the book it shares
    /// with the tally's chunks turns over when a lease is spent, not at the
    /// epoch's end: a hot key is not held to a book per epoch).
    fn default() -> Self {
        Self {
            lifetime: 2 * MICROS_PER_SEC,
            tally: TallySettings::default(),
            hot_per_sec: 50,
            cool_per_sec: 10,
            regional_hot_per_sec: 20,
            regional_cool_per_sec: 5,
        }
    }
}

impl LeaseSettings {
    /// The lease configuration of `policy` when `regions` regions tally it: the
    /// global store's bound on leases is what the regions' tallies leave of the
    /// policy's bound (all of it without regions); leases of at most half of it
    /// per holder, so at least two share it (one that gets none decides exactly).
    pub fn for_policy(&self, policy: &Policy, regions: u32) -> LeaseConfig {
        let leasable = Self::leasable(policy, regions);
        LeaseConfig {
            max_overshoot: leasable,
            max_lease: (leasable / 2).max(1),
            lifetime: self.lifetime,
            hot_per_sec: self.hot_per_sec,
            cool_per_sec: self.cool_per_sec,
        }
    }

    /// What the global store may lease of `policy`'s bound: all of it, or with
    /// regions, the tallies' book (their chunks and any instance leases share
    /// it).
    pub fn leasable(policy: &Policy, regions: u32) -> u64 {
        let bound = policy.max_overshoot().unwrap_or(0);
        if regions == 0 {
            return bound;
        }
        Shares::of(bound, regions).book
    }
}

/// What this instance last learned of a global bucket: when it is full again, on
/// the local clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GlobalView {
    full_at: Micros,
}

/// One bucket's state on this instance.
#[derive(Debug, Default)]
struct Held {
    leases: Vec<LocalLease>,
    /// When the refill in flight was claimed: its task may never run (a request
    /// dropped before its background tasks were spawned, an isolate evicted), so
    /// a claim older than [`REFILL_LOST_AFTER`] is taken as lost.
    refilling: Option<Micros>,
    /// No refill before then: the last take was granted nothing (the book or
    /// the bucket was full), asking again at once would only repeat it.
    retry_at: Micros,
    /// Members of leases spent to the last token: retired by the next take.
    retire: Vec<String>,
    /// What it drew from its region's tally (with a regional store), and the
    /// field and epoch it was counted under (a stopping instance gives it back).
    tally: tally::Held,
    drawn_under: Option<(String, i64)>,
    switch: ModeSwitch,
    global: Option<GlobalView>,
    /// Tokens out on leases, all holders, as the last take reported.
    outstanding: u64,
    used: Micros,
    /// The quota and bound the tokens held were leased under: a policy that
    /// reads otherwise now (an operator's change) holds none of them.
    terms: Option<(Quota, Option<u64>)>,
    /// The bucket's µs per token, as its last lease take said (names the
    /// lease's member when it is given back).
    emission: Micros,
}

impl Held {
    fn at_hand(&self, now: Micros) -> u64 {
        self.leases
            .iter()
            .filter(|l| l.live(now))
            .map(|l| l.tokens)
            .sum()
    }

    /// Whether a refill is due — less than `size` tokens last until `soon` and
    /// none is in flight (claimed less than [`REFILL_LOST_AFTER`] before `now`) —
    /// and if so, marks one in flight.
    fn claim_refill(&mut self, now: Micros, soon: Micros, size: u64) -> bool {
        let in_flight = self
            .refilling
            .is_some_and(|at| now - at < REFILL_LOST_AFTER);
        if in_flight || now < self.retry_at || self.at_hand(soon) >= size {
            return false;
        }
        self.refilling = Some(now);
        true
    }

    /// Drops every token held when `policy` reads otherwise than when they were
    /// leased or drawn (its quota or bound changed): a lowered bound must not be
    /// passed by tokens taken under the old one. A lease is retired, a draw
    /// forgotten (their tokens are lost: a shortfall, never an overshoot).
    fn keep_terms(&mut self, policy: &Policy) {
        let terms = Some((*policy.quota(), policy.max_overshoot()));
        if self.terms == terms {
            return;
        }
        if self.terms.is_some() {
            let gone = std::mem::take(&mut self.leases);
            self.retire.extend(gone.into_iter().map(|l| l.member));
            self.tally.tokens = 0;
        }
        self.terms = terms;
    }

    /// Spends `cost` from the lease expiring first (several if needed); all or none.
    /// A lease spent to the last token is retired with the next take.
    fn spend(&mut self, cost: u64, now: Micros) -> bool {
        self.leases.retain(|l| l.live(now));
        if self.at_hand(now) < cost {
            return false;
        }
        self.leases.sort_by_key(|l| l.until);
        let mut due = cost;
        for l in self.leases.iter_mut() {
            let take = due.min(l.tokens);
            l.tokens -= take;
            due -= take;
            if due == 0 {
                break;
            }
        }
        let (spent, live): (Vec<_>, Vec<_>) = self.leases.drain(..).partition(|l| l.tokens == 0);
        self.retire.extend(spent.into_iter().map(|l| l.member));
        self.leases = live;
        true
    }
}

/// A refill claimed this long ago without an answer is taken as lost (its task
/// never ran): the store's own deadline for a call is at most 10 s
/// (`pipeline::store_deadline`), so a refill still in flight has ended by then.
const REFILL_LOST_AFTER: Micros = 10 * MICROS_PER_SEC;

/// Most buckets tracked at once (the least recently used go first).
const MAX_HELD: usize = 100_000;

/// A refill to run in the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refill {
    pub key: String,
    /// Tokens to ask for.
    pub want: u64,
    /// Members of spent leases to retire with the take, separated by spaces.
    pub retire: String,
    /// The lease id (a number).
    pub id: String,
    /// The bucket's µs per token (names the lease's member).
    pub emission: Micros,
}

impl Refill {
    /// The member the global leases set records for `taken`.
    pub fn member(&self, taken: &Taken) -> String {
        taken.member(&self.id, self.emission)
    }
}

/// This instance's leased tokens and views of the global buckets.
pub struct Leases {
    settings: LeaseSettings,
    /// Bounded buckets are decided by the region's tally (else by leases).
    regional: bool,
    held: Mutex<BoundedMap<String, Held>>,
    prefix: u64,
    next: AtomicU64,
    /// Decisions taken without the global store (leases, or the region's tally).
    pub local: AtomicU64,
    /// The last call to the global store (a refill or an exact check) failed.
    global_failing: std::sync::atomic::AtomicBool,
    /// Leases of `auto` keys that cooled, to give back (bounded: beyond
    /// [`MAX_GIVE_BACKS`] they simply lapse).
    given_back: Mutex<Vec<GiveBack>>,
}

/// The most given-up leases waiting to go back to the global store.
const MAX_GIVE_BACKS: usize = 1_000;

/// A lease an `auto` key gave up when it cooled on this instance: its unspent
/// tokens go back to the global bucket (`lua/lease_return.lua`, which never
/// returns more than the bucket still owes), instead of lapsing unused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiveBack {
    pub key: String,
    pub member: String,
    pub unused: u64,
    /// The bucket's emission interval (µs per token).
    pub emission: Micros,
}

/// What a stopping instance gives up ([`Leases::surrender`]).
#[derive(Debug, Default)]
pub struct Surrendered {
    /// Instance leases, to give back to the global buckets.
    pub leases: Vec<GiveBack>,
    /// Tokens drawn from a region's tally and not spent: (field, epoch, tokens).
    pub draws: Vec<(String, i64, u64)>,
}

impl Leases {
    /// What an instance holds: instance leases, or with `regional` what it drew
    /// from its region's tallies.
    pub fn new(settings: LeaseSettings, seed: Micros, regional: bool) -> Self {
        // a numeric id prefix of 20 random bits: ids stay below 2^53
        let prefix = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_i64(seed);
            h.finish() & 0xF_FFFF
        };
        Self {
            settings,
            regional,
            held: Mutex::new(BoundedMap::new(MAX_HELD, WhenFull::Clear)),
            prefix,
            next: AtomicU64::new(1),
            local: AtomicU64::new(0),
            global_failing: std::sync::atomic::AtomicBool::new(false),
            given_back: Mutex::new(Vec::new()),
        }
    }

    /// Whether the last call to the global store failed: leased decisions are then
    /// degraded (bounded, but the global store cannot confirm anything).
    pub fn global_failing(&self) -> bool {
        self.global_failing.load(Ordering::Relaxed)
    }

    /// Records the outcome of a call to the global store.
    pub fn global_answered(&self, ok: bool) {
        self.global_failing.store(!ok, Ordering::Relaxed);
    }

    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Whether this instance tries to settle its region's tally in `epoch`:
    /// every other epoch, by a bit of its random id prefix (half of a region's
    /// instances try each epoch: a lock attempt costs a region half a command
    /// per instance and epoch; a region of one instance settles every other
    /// epoch, an epoch it skips merged into the next use of its slot and
    /// settled with it).
    pub fn coin(&self, epoch: i64) -> bool {
        (self.prefix as i64 ^ epoch) & 1 == 0
    }

    /// A fresh lease id.
    pub fn id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed) & 0xFFFF_FFFF;
        ((self.prefix << 32) | n).to_string()
    }

    fn with<T>(&self, key: &str, now: Micros, f: impl FnOnce(&mut Held) -> T) -> T {
        let mut held = lock(&self.held);
        // when full, forget buckets unused for two lifetimes or epochs, then anything
        let horizon = now - 2 * self.settings.lifetime.max(self.settings.tally.epoch);
        let h = held
            .get_or_default(key.to_string(), |h| h.used > horizon)
            .expect("a full map of held leases is cleared");
        h.used = now;
        f(h)
    }

    /// Whether `policy` is decided without the global store for `key` now:
    /// `bounded`, or `auto` with the key hot on this instance. Records the
    /// request for the rate meter (and the tally's draw).
    pub fn leased(&self, key: &str, policy: &Policy, now: Micros) -> bool {
        let tally = self.settings.tally;
        match policy.consistency() {
            Consistency::Exact => false,
            Consistency::Bounded => {
                let cfg = LeaseConfig {
                    hot_per_sec: self.settings.regional_hot_per_sec,
                    cool_per_sec: self.settings.regional_cool_per_sec,
                    ..self.settings.for_policy(policy, 0)
                };
                let regional = self.regional;
                let gave_up = self.with(key, now, |h| {
                    h.keep_terms(policy);
                    h.tally.record(&tally, now);
                    let cost = u64::from(policy.cost());
                    if !regional {
                        h.switch.meter.record(now, cost);
                        return vec![];
                    }
                    // with a regional store, a key hot on this instance leases
                    // from the global bucket (what a tally's epoch could not
                    // carry); cooled, its leases go back
                    let was = h.switch.mode;
                    if was == Mode::Leased && h.switch.observe(&cfg, now, cost) == Mode::Exact {
                        return std::mem::take(&mut h.leases);
                    }
                    if was == Mode::Exact {
                        h.switch.observe(&cfg, now, cost);
                    }
                    vec![]
                });
                self.give_back_later(key, policy, gave_up, now);
                true
            }
            Consistency::Auto => {
                let cfg = self.settings.for_policy(policy, 0);
                let (mode, gave_up) = self.with(key, now, |h| {
                    h.keep_terms(policy);
                    h.tally.record(&tally, now);
                    let was = h.switch.mode;
                    let mode = h.switch.observe(&cfg, now, u64::from(policy.cost()));
                    if was != Mode::Leased || mode != Mode::Exact {
                        return (mode, vec![]);
                    }
                    // a draw from the tally is counted already: it lapses
                    h.tally.tokens = 0;
                    (mode, std::mem::take(&mut h.leases))
                });
                self.give_back_later(key, policy, gave_up, now);
                mode == Mode::Leased
            }
        }
    }

    /// Queues the live leases of a cooled `auto` key to go back.
    fn give_back_later(&self, key: &str, policy: &Policy, gone: Vec<LocalLease>, now: Micros) {
        let emission = policy.quota().emission_interval();
        let mut given_back = lock(&self.given_back);
        for l in gone.into_iter().filter(|l| l.live(now) && l.tokens > 0) {
            if given_back.len() < MAX_GIVE_BACKS {
                given_back.push(GiveBack {
                    key: key.to_string(),
                    member: l.member,
                    unused: l.tokens,
                    emission,
                });
            }
        }
    }

    /// The leases given up since the last call, to send back.
    pub fn take_given_back(&self) -> Vec<GiveBack> {
        std::mem::take(&mut *lock(&self.given_back))
    }

    /// What this instance holds, given up as it stops (it holds nothing
    /// afterwards): its instance leases — the live ones with their unspent
    /// tokens, the spent ones still in the global lease book with none — and
    /// what it drew from its region's tally and has not spent yet, while its
    /// epoch lasts (to be taken off the count it was counted in).
    pub fn surrender(&self, now: Micros) -> Surrendered {
        let mut out = Surrendered::default();
        for (key, h) in lock(&self.held).iter_mut() {
            let drawn = std::mem::take(&mut h.tally);
            if let Some((field, e)) = h.drawn_under.take()
                && drawn.tokens > 0
                && drawn.until > now
            {
                out.draws.push((field, e, drawn.tokens));
            }
            let leases = std::mem::take(&mut h.leases);
            let spent = std::mem::take(&mut h.retire).into_iter().map(|m| (m, 0));
            let live = leases
                .into_iter()
                .filter(|l| l.live(now))
                .map(|l| (l.member, l.tokens));
            out.leases
                .extend(spent.chain(live).map(|(member, unused)| GiveBack {
                    key: key.clone(),
                    member,
                    unused,
                    emission: h.emission,
                }));
        }
        out.leases.extend(self.take_given_back());
        out
    }

    /// Spends every bucket's cost from this instance's leases or what it drew
    /// from its region's tally, all or none: the decisions to answer with, or
    /// `None` (nothing spent).
    pub fn spend(&self, buckets: &[(&str, &Policy)], now: Micros) -> Option<Vec<Decision>> {
        let mut held = lock(&self.held);
        let fits = buckets.iter().all(|(k, p)| {
            let cost = u64::from(p.cost());
            held.get(*k)
                .is_some_and(|h| h.at_hand(now) >= cost || h.tally.can_spend(cost, now))
        });
        if !fits {
            return None;
        }
        let mut out = Vec::with_capacity(buckets.len());
        for (k, p) in buckets {
            let h = held.get_mut(*k).expect("checked above");
            let cost = u64::from(p.cost());
            // leases first (they die sooner), else what was drawn from the tally
            if !h.spend(cost, now) {
                h.tally.spend(cost);
            }
            let at_hand = h.at_hand(now) + h.tally.tokens;
            out.push(view(p.quota(), at_hand, h.global, now));
        }
        self.local.fetch_add(1, Ordering::Relaxed);
        Some(out)
    }

    /// The buckets among `buckets` hot on this instance (with a regional
    /// store): leased from the global bucket beside the tally.
    pub fn hot<'a>(&self, buckets: &[(&'a str, &'a Policy)]) -> Vec<(&'a str, &'a Policy)> {
        let held = lock(&self.held);
        buckets
            .iter()
            .filter(|(k, _)| held.get(*k).is_some_and(|h| h.switch.mode == Mode::Leased))
            .copied()
            .collect()
    }

    /// What to ask the region's tally for each of `buckets` (their tokens at
    /// hand do not cover the request): `None` when any was found spent lately
    /// (the exact path decides).
    pub fn tally_asks(
        &self,
        buckets: &[(&str, &Policy)],
        regions: u32,
        now: Micros,
    ) -> Option<Vec<Ask>> {
        let tally = self.settings.tally;
        buckets
            .iter()
            .map(|(k, p)| {
                let shares = shares(p, regions);
                self.with(k, now, |h| {
                    h.tally.ask(&tally, &shares, u64::from(p.cost()), now)
                })
            })
            .collect()
    }

    /// The tally counted `ask` of `key` under `field` (`after`: the count it
    /// replied): what that means, and whether this instance tops the slot up.
    pub fn tally_counted(
        &self,
        key: &str,
        policy: &Policy,
        regions: u32,
        (ask, after, field): (Ask, i64, &str),
        now: Micros,
    ) -> (Counted, Option<tally::TopUp>) {
        let (tally, shares) = (self.settings.tally, shares(policy, regions));
        self.with(key, now, |h| {
            let counted = h.tally.counted(&tally, &shares, ask, after, now);
            if counted.0 == Counted::Admitted && ask.draw > 0 {
                h.drawn_under = Some((field.to_string(), ask.epoch));
            }
            counted
        })
    }

    /// A request counted for `key` went exact after all (another of its
    /// buckets was over): what it drew is given back with it.
    pub fn tally_undrawn(&self, key: &str, now: Micros) {
        self.with(key, now, |h| h.tally.tokens = 0);
    }

    /// A chunk this instance asked for landed in its region's tally.
    pub fn tally_topped_up(&self, key: &str, now: Micros) {
        self.with(key, now, |h| h.tally.topped_up());
    }

    /// The decisions for buckets the region's tally just admitted (`left`: what
    /// the region may still admit of each).
    pub fn tally_decisions(
        &self,
        buckets: &[(&str, &Policy)],
        left: &[u64],
        now: Micros,
    ) -> Vec<Decision> {
        self.local.fetch_add(1, Ordering::Relaxed);
        let held = lock(&self.held);
        buckets
            .iter()
            .zip(left)
            .map(|((k, p), left)| {
                let h = held.get(*k);
                let at_hand = left + h.map_or(0, |h| h.tally.tokens);
                view(p.quota(), at_hand, h.and_then(|h| h.global), now)
            })
            .collect()
    }

    /// The instance-lease refills due now among `buckets` (less than one lease's
    /// worth at hand for the next quarter of a lifetime), each marked as in flight
    /// until [`Leases::refilled`].
    pub fn refills_due(
        &self,
        buckets: &[(&str, &Policy)],
        regions: u32,
        now: Micros,
    ) -> Vec<Refill> {
        let mut due = vec![];
        for (k, p) in buckets {
            let cfg = self.settings.for_policy(p, regions);
            let refill = self.with(k, now, |h| {
                let want = cfg.lease_size(h.switch.meter.per_sec(now));
                // ahead: as soon as less than one lease's worth is left
                if !h.claim_refill(now, now + self.settings.lifetime / 4, want.max(1)) {
                    return None;
                }
                Some((want, std::mem::take(&mut h.retire).join(" ")))
            });
            if let Some((want, retire)) = refill {
                due.push(Refill {
                    key: k.to_string(),
                    want,
                    retire,
                    id: self.id(),
                    emission: p.quota().emission_interval(),
                });
            }
        }
        due
    }

    /// A take for `refill` came back (`None`: it failed). `sent`: the local instant
    /// it was sent at (the lease is spendable until `sent + lifetime`); `global`:
    /// the bucket's full_at translated to the local clock.
    pub fn refilled(
        &self,
        refill: &Refill,
        taken: Option<&Taken>,
        sent: Micros,
        global_full_at: Option<Micros>,
    ) {
        self.global_answered(taken.is_some());
        self.with(&refill.key, sent, |h| {
            h.refilling = None;
            let Some(t) = taken else {
                // the retirements go with the next take
                h.retire
                    .extend(refill.retire.split_whitespace().map(str::to_string));
                return;
            };
            h.outstanding = t.outstanding;
            if let Some(f) = global_full_at {
                h.global = Some(GlobalView { full_at: f });
            }
            h.emission = refill.emission;
            if t.leased == 0 {
                h.retry_at = sent + self.settings.lifetime / 4;
            }
            if t.leased > 0 {
                h.leases.push(LocalLease {
                    member: refill.member(t),
                    tokens: t.leased,
                    granted: t.leased,
                    until: sent + self.settings.lifetime,
                });
            }
        });
    }

    /// What a global answer taught about a bucket (for the headers of later
    /// bounded answers): when it is full again, on the local clock.
    pub fn observe_full_at(
        &self,
        key: &str,
        full_at: Micros,
        outstanding: Option<u64>,
        now: Micros,
    ) {
        self.with(key, now, |h| {
            h.global = Some(GlobalView { full_at });
            if let Some(o) = outstanding {
                h.outstanding = o;
            }
        });
    }

    /// What an exact decision taught about a bucket (for the headers of later
    /// leased answers).
    pub fn observe(&self, key: &str, decision: &Decision, local_now: Micros) {
        let full_at = local_now + (decision.full_at - decision.now).max(0);
        let mut held = lock(&self.held);
        if let Some(h) = held.get_mut(key) {
            h.global = Some(GlobalView { full_at });
        }
    }

    /// Tokens out on leases of `key`, as the last take reported.
    pub fn outstanding(&self, key: &str) -> u64 {
        lock(&self.held).get(key).map_or(0, |h| h.outstanding)
    }
}

/// What `policy`'s bound gives each of `regions` regions' tallies.
pub fn shares(policy: &Policy, regions: u32) -> Shares {
    Shares::of(policy.max_overshoot().unwrap_or(0), regions)
}

/// The decision a leased answer reports: `at_hand` tokens still spendable here
/// plus what the global bucket had left when this instance last heard from it
/// (projected to `now`), at most the capacity; full again when the global bucket
/// said, or, never having heard, once `at_hand` refills.
fn view(quota: &Quota, at_hand: u64, global: Option<GlobalView>, now: Micros) -> Decision {
    let t = quota.emission_interval();
    let cap = quota.capacity();
    let (global_left, full_at) = match global {
        Some(g) => {
            let debt = (g.full_at - now).max(0);
            let left = ((quota.burst_window() - debt).max(0) / t) as u64;
            (left, g.full_at.max(now))
        }
        None => (0, now + (cap.saturating_sub(at_hand) as i64) * t),
    };
    Decision {
        outcome: Admission::Allowed,
        limit: cap,
        remaining: (at_hand + global_left).min(cap),
        now,
        full_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_764_000_000_000_000;

    fn policy(consistency: &str, bound: u64) -> Policy {
        Policy::from_json(&format!(
            r#"{{"name":"p","dimensions":["api_key"],"quota":{{"capacity":100,"period":"1s"}},
               "failure_mode":"fail_closed","consistency":"{consistency}","max_overshoot":{bound}}}"#
        ))
        .unwrap()
    }

    fn taken(leased: u64, now: Micros) -> Taken {
        Taken {
            admitted: true,
            leased,
            now,
            full_at: now + 500_000,
            expires_at: now + 2_000_000,
            outstanding: leased,
        }
    }

    #[test]
    fn a_lease_is_spent_all_or_nothing_until_it_expires_then_refilled_ahead() {
        let l = Leases::new(LeaseSettings::default(), 7, false);
        let p = policy("bounded", 40);
        assert!(l.leased("k", &p, T0));
        assert_eq!(l.spend(&[("k", &p)], T0), None, "nothing leased yet");
        let due = l.refills_due(&[("k", &p)], 0, T0);
        assert_eq!(due.len(), 1);
        assert!(
            l.refills_due(&[("k", &p)], 0, T0).is_empty(),
            "one refill in flight"
        );
        l.refilled(&due[0], Some(&taken(3, T0)), T0, Some(T0 + 500_000));
        for left in [2, 1, 0] {
            let d = l.spend(&[("k", &p)], T0 + 10).expect("a token at hand");
            // at hand + the global bucket's 50 left (full in 0.5 s at 100/s)
            assert_eq!(d[0].remaining, left + 50);
        }
        assert_eq!(l.spend(&[("k", &p)], T0 + 10), None);
        // the spent lease is retired by the next take
        let first = due[0].member(&taken(3, T0));
        let due = l.refills_due(&[("k", &p)], 0, T0 + 20);
        assert_eq!(due[0].retire, first);
        l.refilled(&due[0], Some(&taken(5, T0 + 20)), T0 + 20, None);
        let lifetime = l.settings().lifetime;
        assert!(
            l.spend(&[("k", &p)], T0 + 20 + lifetime).is_none(),
            "expired with its global lease"
        );
    }

    #[test]
    fn auto_leases_only_a_hot_key() {
        let l = Leases::new(LeaseSettings::default(), 7, false);
        let p = policy("auto", 40);
        let mut now = T0;
        let mut turned = None;
        for i in 0..200 {
            now += 5_000; // 200/s
            if l.leased("k", &p, now) {
                turned = Some(i);
                break;
            }
        }
        assert!(turned.is_some_and(|i| i < 100), "{turned:?}");
        let exact = Policy::from_json(
            r#"{"name":"p","dimensions":["api_key"],"quota":{"capacity":100,"period":"1s"},"failure_mode":"fail_closed"}"#,
        )
        .unwrap();
        assert!(!l.leased("k", &exact, now));
    }

    /// A cooled `auto` key's live instance leases go back to the global bucket;
    /// with a regional store, what it drew from the tally is counted there
    /// already and simply lapses (nothing goes back through the global
    /// give-back, issue 39's smell 1).
    #[test]
    fn a_cooled_auto_key_gives_back_leases_and_drops_its_draw() {
        for regional in [false, true] {
            let settings = LeaseSettings {
                lifetime: 10 * MICROS_PER_SEC,
                ..LeaseSettings::default()
            };
            let l = Leases::new(settings, 7, regional);
            let p = policy("auto", 40);
            let mut now = T0;
            while !l.leased("k", &p, now) {
                now += 5_000; // 200/s: turns hot
                assert!(now < T0 + 10 * MICROS_PER_SEC, "never turned hot");
            }
            if regional {
                let ask = l.tally_asks(&[("k", &p)], 1, now).unwrap()[0];
                // a bound of 40 over one region: a credit of 2
                let ask = Ask { draw: 1, ..ask };
                let (c, _) = l.tally_counted("k", &p, 1, (ask, 2, "f"), now);
                assert_eq!(c, Counted::Admitted);
                assert!(l.spend(&[("k", &p)], now).is_some(), "a drawn token");
            } else {
                let due = l.refills_due(&[("k", &p)], 0, now);
                l.refilled(&due[0], Some(&taken(10, now)), now, None);
            }
            // 4 requests/s for 3 s: cools while the lease (10 s) still lives
            for _ in 0..12 {
                now += 250_000;
                l.leased("k", &p, now);
            }
            let given = l.take_given_back();
            if regional {
                assert!(given.is_empty(), "{given:?}");
                assert!(l.spend(&[("k", &p)], now).is_none(), "the draw lapsed");
            } else {
                assert_eq!(given.len(), 1, "the instance lease goes back");
            }
        }
    }

    #[test]
    fn a_changed_bound_drops_what_was_drawn_under_the_old_one() {
        let l = Leases::new(LeaseSettings::default(), 7, true);
        let (p, lower) = (policy("bounded", 80), policy("bounded", 40));
        assert!(l.leased("k", &p, T0));
        // a bound of 80 over one region: a credit of 4
        let ask = Ask {
            draw: 3,
            ..l.tally_asks(&[("k", &p)], 1, T0).unwrap()[0]
        };
        let (c, _) = l.tally_counted("k", &p, 1, (ask, 4, "f"), T0);
        assert_eq!(c, Counted::Admitted);
        let drawn = l.surrender(T0 + 1).draws;
        assert_eq!(
            drawn,
            [("f".to_string(), ask.epoch, 3)],
            "what a stop gives back"
        );
        let (c, _) = l.tally_counted("k", &p, 1, (ask, 4, "f"), T0);
        assert_eq!(c, Counted::Admitted);
        assert_eq!(c, Counted::Admitted);
        assert!(l.leased("k", &lower, T0 + 10));
        assert!(l.spend(&[("k", &lower)], T0 + 10).is_none());
    }
}
