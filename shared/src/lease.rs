//! Lease mode (the design's "distributed token bucket"): an edge instance takes a
//! lease of up to N tokens from the central bucket in the same call that decides
//! one request exactly (`lua/lease_take.lua`), spends the lease locally without
//! calling Redis, and gives back what it did not use (`lua/lease_return.lua`).
//!
//! What it trades: tokens taken now but spent later can make the admissions of a
//! window exceed `capacity + refill × window` by the tokens outstanding on leases
//! when the window starts. The take script refuses to lease past
//! [`LeaseConfig::max_overshoot`] tokens outstanding per bucket (live leases are
//! recorded next to the bucket), so that number is a hard bound whatever the number
//! of instances. Expired leases lapse; their unspent tokens are lost (never an
//! overshoot, only a shortfall).
//!
//! Everything here is pure: a twin of both scripts ([`Central`], used by the
//! property tests), the local spender ([`LocalLease`]), and the automatic switch of
//! a key between exact and leased mode by its observed rate ([`ModeSwitch`]).
//! Clocks are injected.

use crate::script::LuaScript;
use crate::time::{MICROS_PER_SEC, Micros};

pub(crate) mod sha {
    include!(concat!(env!("OUT_DIR"), "/lease_sha1.rs"));
}

/// `lua/lease_take.lua`.
pub const LEASE_TAKE: LuaScript = LuaScript {
    source: sha::LEASE_TAKE_SOURCE,
    sha1: sha::LEASE_TAKE_SHA1,
};

/// `lua/lease_return.lua`.
pub const LEASE_RETURN: LuaScript = LuaScript {
    source: sha::LEASE_RETURN_SOURCE,
    sha1: sha::LEASE_RETURN_SHA1,
};

/// `lua/pool_take.lua` (a regional store).
pub const POOL_TAKE: LuaScript = LuaScript {
    source: sha::POOL_TAKE_SOURCE,
    sha1: sha::POOL_TAKE_SHA1,
};

/// `lua/pool_add.lua` (a regional store).
pub const POOL_ADD: LuaScript = LuaScript {
    source: sha::POOL_ADD_SOURCE,
    sha1: sha::POOL_ADD_SHA1,
};

/// A bucket's pool in a regional store (same hash tag as the bucket: one slot in
/// a regional cluster too): ONE string holding its chunks, its credit in use, its
/// refill lock and the chunks spent out (`lua/pool_take.lua`).
pub fn pool_key(bucket_key: &str) -> String {
    format!("{bucket_key}:rpool")
}

/// Part of a sub-lease: tokens of one pool chunk an instance spends in its own
/// memory, for `life` µs from the pool's answer (less on the instance's own
/// reckoning: it counts from when it sent the take), then reports done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubLease {
    /// The chunk's member (the global lease's).
    pub chunk: String,
    pub tokens: u64,
    pub life: Micros,
}

/// The reply of [`POOL_TAKE`] for `n` buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTaken {
    pub admitted: bool,
    /// The regional store's clock.
    pub now: Micros,
    /// Per bucket: tokens left in the pool after this call.
    pub left: Vec<u64>,
    /// Per bucket: this caller took the refill lock and refills the pool...
    pub refill: Vec<bool>,
    /// ...charging this much credit to the global bucket...
    pub unconfirmed: Vec<u64>,
    /// ...and retiring these members (chunks spent out) at the global store.
    pub retire: Vec<Vec<String>>,
    /// Per bucket: the parts of the caller's sub-lease.
    pub leases: Vec<Vec<SubLease>>,
}

impl PoolTaken {
    /// `None`: the call came too late (`{2, now}`, nothing spent).
    pub fn from_reply(reply: &[i64], n: usize) -> Result<Option<Self>, String> {
        let bad = || format!("unexpected pool reply {reply:?}");
        let (admitted, now, mut rest) = match reply {
            [2, _] => return Ok(None),
            [a @ (0 | 1), now, rest @ ..] if *now >= 0 => (*a == 1, *now, rest),
            _ => return Err(bad()),
        };
        let mut taken = Self {
            admitted,
            now,
            left: Vec::with_capacity(n),
            refill: Vec::with_capacity(n),
            unconfirmed: Vec::with_capacity(n),
            retire: Vec::with_capacity(n),
            leases: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let [left, refill, unconfirmed, k, tail @ ..] = rest else {
                return Err(bad());
            };
            let k = usize::try_from(*k).map_err(|_| bad())?;
            if *left < 0 || !(0..=1).contains(refill) || *unconfirmed < 0 || tail.len() < 3 * k + 1
            {
                return Err(bad());
            }
            taken.left.push(*left as u64);
            taken.refill.push(*refill == 1);
            taken.unconfirmed.push(*unconfirmed as u64);
            taken.retire.push(spent_members(&tail[..3 * k])?);
            let (j, tail) = (tail[3 * k], &tail[3 * k + 1..]);
            let j = usize::try_from(j).map_err(|_| bad())?;
            if tail.len() < 5 * j {
                return Err(bad());
            }
            taken.leases.push(sub_leases(&tail[..5 * j])?);
            rest = &tail[5 * j..];
        }
        if !rest.is_empty() {
            return Err(bad());
        }
        Ok(Some(taken))
    }
}

/// What one bucket asks of its pool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolAsk {
    pub cost: u64,
    /// Below this many tokens left, the caller is asked to refill.
    pub low: u64,
    /// The region's credit cap for the bucket (0: none).
    pub credit: u64,
    /// Tokens wanted for the caller's sub-lease (0: none).
    pub want: u64,
    /// The caller's sub-leases it is done with: (chunk member, tokens granted).
    pub done: Vec<(String, u64)>,
}

/// `ARGV` of [`POOL_TAKE`]: the clock (`""`, `"<T"` or an instant), then cost,
/// low-water mark, credit cap, tokens wanted and sub-leases done per bucket, then
/// the refill lock's lifetime (ms) and how long before its chunk a sub-lease ends
/// (µs).
pub fn pool_take_args(
    clock: String,
    buckets: &[PoolAsk],
    lock_ms: u64,
    margin: Micros,
) -> Vec<String> {
    pool_take_args_ahead(clock, buckets, lock_ms, margin, 0)
}

/// [`pool_take_args`] with a horizon: tokens of chunks that die within `ahead`
/// µs count for nothing against the low-water mark (0: the argument is left out,
/// as before), so the pool is refilled before its chunks die.
pub fn pool_take_args_ahead(
    clock: String,
    buckets: &[PoolAsk],
    lock_ms: u64,
    margin: Micros,
    ahead: Micros,
) -> Vec<String> {
    let mut args = Vec::with_capacity(3 + 5 * buckets.len());
    args.push(clock);
    for b in buckets {
        args.push(b.cost.to_string());
        args.push(b.low.to_string());
        args.push(b.credit.to_string());
        args.push(b.want.to_string());
        let done: Vec<String> = b.done.iter().map(|(m, n)| format!("{m}={n}")).collect();
        args.push(done.join(" "));
    }
    args.push(lock_ms.max(1).to_string());
    args.push(margin.max(0).to_string());
    if ahead > 0 {
        args.push(ahead.to_string());
    }
    args
}

/// Sub-lease parts as the pool script sends them, five integers each.
fn sub_leases(ints: &[i64]) -> Result<Vec<SubLease>, String> {
    if !ints.len().is_multiple_of(5) || ints.iter().any(|v| *v < 0) {
        return Err(format!("unexpected sub-lease parts {ints:?}"));
    }
    Ok(ints
        .chunks(5)
        .map(|p| SubLease {
            chunk: format!("{}:{}:{}", p[0], p[1], p[2]),
            tokens: p[3] as u64,
            life: p[4],
        })
        .collect())
}

/// Spent members as the pool scripts send them, three integers each, named as
/// the global leases set names them.
pub fn spent_members(ints: &[i64]) -> Result<Vec<String>, String> {
    if !ints.len().is_multiple_of(3) || ints.iter().any(|v| *v < 0) {
        return Err(format!("unexpected spent members {ints:?}"));
    }
    Ok(ints
        .chunks(3)
        .map(|m| format!("{}:{}:{}", m[0], m[1], m[2]))
        .collect())
}

#[cfg(any(test, feature = "twins"))]
/// One chunk of a regional pool: tokens leased from the global bucket, `free`
/// in the pool and `out` on sub-leases not yet reported done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub member: String,
    pub free: u64,
    pub out: u64,
    /// Spendable until then (the regional clock).
    pub expires: Micros,
}

#[cfg(any(test, feature = "twins"))]
/// A pure twin of one bucket's regional pool ([`POOL_TAKE`], [`POOL_ADD`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    /// Live chunks, soonest expiry first.
    pub chunks: Vec<Chunk>,
    pub spent: Vec<String>,
    pub locked_until: Micros,
    /// Admitted on the region's credit and not yet released...
    pub credit: u64,
    /// ...of which not yet charged to the global bucket.
    pub uncharged: u64,
}

#[cfg(any(test, feature = "twins"))]
impl Pool {
    fn live(&self) -> u64 {
        self.chunks.iter().map(|c| c.free).sum()
    }

    /// Free tokens of the chunks still live at `at`.
    fn lasting(&self, at: Micros) -> u64 {
        self.chunks
            .iter()
            .filter(|c| c.expires > at)
            .map(|c| c.free)
            .sum()
    }

    /// The script's settling: sub-leases reported done, dead chunks dropped,
    /// drained ones (nothing free, nothing out) spent.
    fn settle(&mut self, done: &[(String, u64)], now: Micros) {
        for c in self.chunks.iter_mut() {
            let back: u64 = done
                .iter()
                .filter(|(m, _)| *m == c.member)
                .map(|(_, n)| n)
                .sum();
            c.out = c.out.saturating_sub(back);
        }
        let chunks = std::mem::take(&mut self.chunks);
        for c in chunks {
            if c.expires <= now {
                continue;
            }
            if c.free == 0 && c.out == 0 {
                self.spent.push(c.member);
            } else {
                self.chunks.push(c);
            }
        }
        self.chunks
            .sort_by(|a, b| (a.expires, &a.member).cmp(&(b.expires, &b.member)));
    }

    /// Spends `cost` from the chunks expiring first, then leases up to `want`:
    /// first from the chunks expiring first among those living more than `young`
    /// (a young chunk is drawn out, then retired, instead of keeping a remainder
    /// behind newer chunks until it dies: with 60 s chunks, a key's chunks were
    /// never retired and filled the bound), then from those expiring last (only
    /// while more than `margin` of their life is left).
    fn spend_and_lease(
        &mut self,
        cost: u64,
        want: u64,
        now: Micros,
        margin: Micros,
        young: Micros,
    ) -> Vec<SubLease> {
        let mut due = cost;
        for c in self.chunks.iter_mut() {
            let spend = due.min(c.free);
            c.free -= spend;
            due -= spend;
        }
        let mut parts = vec![];
        let mut want = want;
        let mut lease = |c: &mut Chunk, young: Micros| {
            let life = c.expires - now - margin;
            if want > 0 && life > young && c.free > 0 {
                let k = want.min(c.free);
                c.free -= k;
                c.out += k;
                want -= k;
                parts.push(SubLease {
                    chunk: c.member.clone(),
                    tokens: k,
                    life,
                });
            }
        };
        for c in self.chunks.iter_mut() {
            lease(c, young);
        }
        for c in self.chunks.iter_mut().rev() {
            lease(c, 0);
        }
        self.settle(&[], now);
        parts
    }

    /// [`POOL_TAKE`] over several pools at once: all or nothing.
    pub fn take(
        pools: &mut [&mut Pool],
        asks: &[PoolAsk],
        now: Micros,
        lock: Micros,
        margin: Micros,
    ) -> PoolTaken {
        Self::take_ahead(pools, asks, now, lock, margin, 0)
    }

    /// [`Pool::take`] with a horizon (`ARGV[5n+4]`): chunks dying within `ahead`
    /// count for nothing against the low-water mark.
    pub fn take_ahead(
        pools: &mut [&mut Pool],
        asks: &[PoolAsk],
        now: Micros,
        lock: Micros,
        margin: Micros,
        ahead: Micros,
    ) -> PoolTaken {
        for (p, a) in pools.iter_mut().zip(asks) {
            p.settle(&a.done, now);
        }
        let by_credit: Vec<Option<bool>> = pools
            .iter()
            .zip(asks)
            .map(|(p, a)| {
                if p.live() >= a.cost {
                    Some(false)
                } else if p.credit + a.cost <= a.credit {
                    Some(true)
                } else {
                    None
                }
            })
            .collect();
        let admitted = by_credit.iter().all(Option::is_some);
        let mut taken = PoolTaken {
            admitted,
            now,
            left: vec![],
            refill: vec![],
            unconfirmed: vec![],
            retire: vec![],
            leases: vec![],
        };
        for ((p, a), credit) in pools.iter_mut().zip(asks).zip(by_credit) {
            let parts = match (admitted, credit) {
                (true, Some(true)) => {
                    p.credit += a.cost;
                    p.uncharged += a.cost;
                    vec![]
                }
                (true, _) => p.spend_and_lease(a.cost, a.want, now, margin, 2 * ahead),
                (false, _) => vec![],
            };
            let l = p.live();
            let take_lock =
                (p.lasting(now + ahead) < a.low || p.credit > 0) && p.locked_until <= now;
            if take_lock {
                p.locked_until = now + lock;
            }
            taken.left.push(l);
            taken.refill.push(take_lock);
            taken
                .unconfirmed
                .push(if take_lock { p.uncharged } else { 0 });
            taken.retire.push(if take_lock {
                std::mem::take(&mut p.spent)
            } else {
                vec![]
            });
            taken.leases.push(parts);
        }
        taken
    }

    /// [`POOL_ADD`]: a chunk spendable for `life` from `now`, `charged` credit
    /// charged to the global bucket (all charged credit released when `clear`: the
    /// bucket was out of debt); releases the lock and returns the tokens held.
    pub fn add(
        &mut self,
        member: &str,
        tokens: u64,
        life: Micros,
        charged: u64,
        clear: bool,
        now: Micros,
    ) -> u64 {
        self.chunks.retain(|c| c.expires > now);
        if !member.is_empty() && tokens > 0 && life > 0 {
            self.chunks.push(Chunk {
                member: member.to_string(),
                free: tokens,
                out: 0,
                expires: now + life,
            });
            self.chunks
                .sort_by(|a, b| (a.expires, &a.member).cmp(&(b.expires, &b.member)));
        }
        self.uncharged = self.uncharged.saturating_sub(charged);
        if clear {
            self.credit = self.uncharged;
        }
        self.credit = self.credit.max(self.uncharged);
        self.locked_until = 0;
        self.live()
    }
}

/// The book of live leases next to a bucket (same hash tag, same slot): one
/// string (`lua/lease_take.lua`).
pub fn leases_key(bucket_key: &str) -> String {
    format!("{bucket_key}:lease")
}

/// How leases are sized and bounded, and when a key switches mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// At most this many tokens outstanding on leases per bucket, all instances
    /// together: the overshoot bound (enforced by the take script).
    pub max_overshoot: u64,
    /// At most this many tokens in one lease.
    pub max_lease: u64,
    /// A lease's lifetime; the holder stops spending it at `sent + lifetime`.
    pub lifetime: Micros,
    /// A key turns leased when this instance sees at least this many requests/s...
    pub hot_per_sec: u64,
    /// ...and exact again when it sees at most this many (hysteresis: < hot).
    pub cool_per_sec: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            max_overshoot: 100,
            max_lease: 20,
            lifetime: MICROS_PER_SEC,
            hot_per_sec: 200,
            cool_per_sec: 50,
        }
    }
}

impl LeaseConfig {
    /// Tokens to ask for when this instance sees `per_sec` requests/s: what it will
    /// spend in half a lifetime, 1..=`max_lease`.
    pub fn lease_size(&self, per_sec: u64) -> u64 {
        let half_life =
            (per_sec as u128 * self.lifetime as u128 / 2 / MICROS_PER_SEC as u128) as u64;
        half_life.clamp(1, self.max_lease.max(1))
    }

    /// `ARGV` of [`LEASE_TAKE`] charging `cost` even without room (see
    /// [`Central::take_charging`]).
    #[allow(clippy::too_many_arguments)]
    pub fn charge_args(
        &self,
        burst: Micros,
        emission: Micros,
        cost: u64,
        want: u64,
        id: &str,
        spent: Option<&str>,
    ) -> Vec<String> {
        let mut args = self.take_args(None, burst, emission, cost, want, id, spent);
        args.push("1".into());
        args
    }

    /// `ARGV` of [`LEASE_TAKE`]; `now = None` lets Redis' `TIME` decide.
    #[allow(clippy::too_many_arguments)]
    pub fn take_args(
        &self,
        now: Option<Micros>,
        burst: Micros,
        emission: Micros,
        cost: u64,
        want: u64,
        id: &str,
        spent: Option<&str>,
    ) -> Vec<String> {
        vec![
            now.map(|n| n.to_string()).unwrap_or_default(),
            burst.to_string(),
            emission.to_string(),
            cost.to_string(),
            want.to_string(),
            self.max_overshoot.to_string(),
            self.lifetime.to_string(),
            id.to_string(),
            spent.unwrap_or_default().to_string(),
        ]
    }
}

/// The reply of [`LEASE_TAKE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub admitted: bool,
    pub leased: u64,
    pub now: Micros,
    pub full_at: Micros,
    pub expires_at: Micros,
    /// Tokens out on live leases after this take, all holders together (at most
    /// the bound): the overshoot budget in use.
    pub outstanding: u64,
}

impl Taken {
    pub fn from_reply(reply: &[i64]) -> Result<Self, String> {
        match reply {
            [a, l, n, f, e, o] if (*a == 0 || *a == 1) && *l >= 0 && *o >= 0 => Ok(Self {
                admitted: *a == 1,
                leased: *l as u64,
                now: *n,
                full_at: *f,
                expires_at: *e,
                outstanding: *o as u64,
            }),
            other => Err(format!("unexpected lease reply {other:?}")),
        }
    }

    /// The lease's member in the leases set, as the return script names it.
    pub fn member(&self, id: &str, emission: Micros) -> String {
        format!(
            "{id}:{}:{}",
            self.leased,
            self.full_at - self.leased as i64 * emission
        )
    }
}

/// One lease held by an instance: tokens left, spendable until `until` on the
/// instance's own clock (the instant it SENT the take, plus the lifetime: never
/// after Redis considers the lease expired, whatever the round trip).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLease {
    /// The global lease's member (a sub-lease: its pool chunk's).
    pub member: String,
    /// Tokens left, of `granted`.
    pub tokens: u64,
    pub granted: u64,
    pub until: Micros,
}

impl LocalLease {
    /// Spends `cost` tokens when the lease is live and holds them.
    pub fn spend(&mut self, cost: u64, now: Micros) -> bool {
        if now < self.until && self.tokens >= cost {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }

    pub fn live(&self, now: Micros) -> bool {
        now < self.until
    }
}

/// Requests per second as seen by one instance: two fixed one-second windows, the
/// previous one weighted by how much of it the sliding second still covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateMeter {
    start: Micros,
    current: u64,
    previous: u64,
}

impl RateMeter {
    pub fn record(&mut self, now: Micros, n: u64) {
        self.roll(now);
        self.current += n;
    }

    fn roll(&mut self, now: Micros) {
        if now >= self.start + MICROS_PER_SEC {
            let windows = (now - self.start) / MICROS_PER_SEC;
            self.previous = if windows == 1 { self.current } else { 0 };
            self.current = 0;
            self.start += windows * MICROS_PER_SEC;
        }
        if self.start == 0 || now < self.start {
            self.start = now;
        }
    }

    pub fn per_sec(&mut self, now: Micros) -> u64 {
        self.roll(now);
        let into = (now - self.start).clamp(0, MICROS_PER_SEC);
        let weight = (MICROS_PER_SEC - into) as u128;
        self.current + (self.previous as u128 * weight / MICROS_PER_SEC as u128) as u64
    }
}

/// How a key is decided right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every request is one script call (exact).
    Exact,
    /// Requests are spent from local leases.
    Leased,
}

/// Switches one key from exact to leased when it turns hot and back when it cools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeSwitch {
    pub mode: Mode,
    pub meter: RateMeter,
}

impl Default for ModeSwitch {
    fn default() -> Self {
        Self {
            mode: Mode::Exact,
            meter: RateMeter::default(),
        }
    }
}

impl ModeSwitch {
    /// Records one request of `cost` at `now` and returns the mode to decide it in.
    pub fn observe(&mut self, config: &LeaseConfig, now: Micros, cost: u64) -> Mode {
        self.meter.record(now, cost.max(1));
        let rate = self.meter.per_sec(now);
        self.mode = match self.mode {
            Mode::Exact if rate >= config.hot_per_sec => Mode::Leased,
            Mode::Leased if rate <= config.cool_per_sec => Mode::Exact,
            m => m,
        };
        self.mode
    }
}

#[cfg(any(test, feature = "twins"))]
/// A pure twin of the two scripts over one bucket (tests and simulations).
#[derive(Debug, Clone, Default)]
pub struct Central {
    pub full_at: Micros,
    /// (member, expires_at, tokens, base)
    pub leases: Vec<(String, Micros, u64, Micros)>,
}

#[cfg(any(test, feature = "twins"))]
impl Central {
    /// [`LEASE_TAKE`] at `now` (`spent`: members separated by spaces).
    #[allow(clippy::too_many_arguments)]
    pub fn take(
        &mut self,
        config: &LeaseConfig,
        now: Micros,
        burst: Micros,
        t: Micros,
        cost: u64,
        want: u64,
        id: &str,
        spent: Option<&str>,
    ) -> Taken {
        self.take_charging(config, now, burst, t, cost, want, id, spent, false)
    }

    /// [`LEASE_TAKE`] with `ARGV[10]`: `forced` charges the cost even without room
    /// (into debt; `admitted` then says whether it fitted).
    #[allow(clippy::too_many_arguments)]
    pub fn take_charging(
        &mut self,
        config: &LeaseConfig,
        now: Micros,
        burst: Micros,
        t: Micros,
        cost: u64,
        want: u64,
        id: &str,
        spent: Option<&str>,
        forced: bool,
    ) -> Taken {
        let base = self.full_at.max(now);
        let room = (burst - (base - now)).div_euclid(t);
        if room < cost as i64 && !forced {
            return Taken {
                admitted: false,
                leased: 0,
                now,
                full_at: self.full_at,
                expires_at: 0,
                outstanding: 0,
            };
        }
        let spent: Vec<&str> = spent.map_or(vec![], |s| s.split_whitespace().collect());
        self.leases
            .retain(|l| l.1 > now && !spent.contains(&l.0.as_str()));
        let outstanding: u64 = self.leases.iter().map(|l| l.2).sum();
        let extra = (want as i64)
            .min(room - cost as i64)
            .min(config.max_overshoot as i64 - outstanding as i64)
            .max(0) as u64;
        let taken = cost + extra;
        if taken > 0 {
            self.full_at = base + taken as i64 * t;
        }
        let mut expires_at = 0;
        if extra > 0 {
            expires_at = now + config.lifetime;
            let lease_base = self.full_at - extra as i64 * t;
            self.leases.push((
                format!("{id}:{extra}:{lease_base}"),
                expires_at,
                extra,
                lease_base,
            ));
        }
        Taken {
            admitted: room >= cost as i64,
            leased: extra,
            now,
            full_at: self.full_at,
            expires_at,
            outstanding: outstanding + extra,
        }
    }

    /// [`LEASE_RETURN`] at `now`; returns the tokens refunded.
    pub fn give_back(&mut self, now: Micros, t: Micros, member: &str, unused: u64) -> u64 {
        let Some(i) = self.leases.iter().position(|l| l.0 == member) else {
            return 0;
        };
        let (_, expires, granted, base) = self.leases.remove(i);
        if expires <= now {
            return 0;
        }
        let wasted = if base < now {
            (now - base + t - 1) / t
        } else {
            0
        };
        let refund = unused.min(granted) as i64 - wasted;
        if refund <= 0 || self.full_at <= now {
            return 0;
        }
        self.full_at = (self.full_at - refund * t).max(now);
        refund as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Micros = 10_000; // 100 tokens/s

    fn config(bound: u64, max_lease: u64) -> LeaseConfig {
        LeaseConfig {
            max_overshoot: bound,
            max_lease,
            lifetime: 200_000,
            hot_per_sec: 100,
            cool_per_sec: 20,
        }
    }

    /// The largest excess over `capacity + (b − a)/T` of the admissions within any
    /// window [a, b] (the exact token bucket's own guarantee has excess ≤ 0).
    fn worst_excess(admitted: &[Micros], capacity: u64) -> i64 {
        let mut times = admitted.to_vec();
        times.sort_unstable();
        let mut worst = i64::MIN;
        for i in 0..times.len() {
            for j in i..times.len() {
                let count = (j - i + 1) as i64;
                let allowed = capacity as i64 + (times[j] - times[i]) / T;
                worst = worst.max(count - allowed);
            }
        }
        worst
    }

    /// Instances at random instants: each spends its live lease, or calls take
    /// (cost 1 + a lease), and sometimes gives back what is left.
    fn simulate(
        cfg: &LeaseConfig,
        capacity: u64,
        events: &[(usize, Micros, bool)],
        instances: usize,
    ) -> (Vec<Micros>, Vec<Micros>, usize) {
        let burst = capacity as i64 * T;
        let mut central = Central::default();
        let mut exact = Central::default();
        let mut leases: Vec<Option<LocalLease>> = vec![None; instances];
        let (mut admitted, mut admitted_exact, mut calls) = (vec![], vec![], 0usize);
        let mut now = 1_000_000;
        for (n, &(who, step, give_back)) in events.iter().enumerate() {
            now += step;
            let who = who % instances;
            let exact_cfg = LeaseConfig {
                max_overshoot: 0,
                ..*cfg
            };
            if exact
                .take(&exact_cfg, now, burst, T, 1, 0, "x", None)
                .admitted
            {
                admitted_exact.push(now);
            }
            if give_back && let Some(l) = leases[who].take() {
                calls += 1;
                central.give_back(now, T, &l.member, l.tokens);
            }
            if let Some(l) = leases[who].as_mut()
                && l.spend(1, now)
            {
                admitted.push(now);
                continue;
            }
            calls += 1;
            let id = format!("i{who}-{n}");
            // a lease spent to the last token is retired by the next take
            let spent = leases[who]
                .take()
                .filter(|l| l.tokens == 0)
                .map(|l| l.member);
            let got = central.take(cfg, now, burst, T, 1, cfg.max_lease, &id, spent.as_deref());
            if got.admitted {
                admitted.push(now);
            }
            leases[who] = (got.leased > 0).then(|| LocalLease {
                member: got.member(&id, T),
                tokens: got.leased,
                granted: got.leased,
                until: now + cfg.lifetime,
            });
        }
        (admitted, admitted_exact, calls)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn overshoot_never_exceeds_the_configured_bound(
            capacity in 1u64..40,
            bound in 0u64..30,
            max_lease in 1u64..20,
            instances in 1usize..12,
            events in proptest::collection::vec((0usize..64, 0i64..30_000, proptest::bool::weighted(0.1)), 1..160),
        ) {
            let cfg = config(bound, max_lease);
            let (admitted, admitted_exact, _) = simulate(&cfg, capacity, &events, instances);
            prop_assert!(worst_excess(&admitted_exact, capacity) <= 0);
            let excess = worst_excess(&admitted, capacity);
            prop_assert!(excess <= bound as i64, "excess {excess} > bound {bound}");
        }
    }

    /// What can happen to the system around one bucket.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        /// A request at regionless instance `i` (instance leases) or at instance
        /// `x` of region `x / 2` (its sub-leases, else the region's pool).
        AtInstance(usize),
        InRegion(usize),
        /// An instance dies: its lease is lost.
        Crash(usize),
        /// An instance of a region is evicted (an isolate): its sub-leases are lost,
        /// never reported done.
        Evict(usize),
        /// A regional store loses its pool's chunks (the credit counter is kept:
        /// regional stores run with persistence, see docs/consistency.md).
        Wipe(usize),
        /// The global store stops / starts answering.
        Global(bool),
    }

    fn event() -> impl Strategy<Value = (Event, Micros)> {
        let e = prop_oneof![
            6 => (0usize..4).prop_map(Event::AtInstance),
            8 => (0usize..6).prop_map(Event::InRegion),
            1 => (0usize..4).prop_map(Event::Crash),
            1 => (0usize..6).prop_map(Event::Evict),
            1 => (0usize..3).prop_map(Event::Wipe),
            1 => proptest::bool::ANY.prop_map(Event::Global),
        ];
        (e, 0i64..20_000)
    }

    /// A refill on its way: the global take lands at `take_at`, the pool add at
    /// `add_at` (`region: None`: an instance lease).
    struct Refill {
        take_at: Micros,
        add_at: Micros,
        sent: Micros,
        region: Option<usize>,
        instance: usize,
        id: String,
        retire: String,
        /// Credit to charge with the take.
        unconfirmed: u64,
        taken: Option<Taken>,
        /// The global store answered the take.
        answered: bool,
    }

    /// A sub-lease an instance holds: its chunk, tokens granted, tokens left,
    /// spendable until (the instance's clock).
    #[derive(Debug, Clone)]
    struct Held {
        chunk: String,
        granted: u64,
        left: u64,
        until: Micros,
    }

    fn at_hand(subs: &[Held], now: Micros) -> u64 {
        subs.iter().filter(|h| h.until > now).map(|h| h.left).sum()
    }

    fn spend_sub(subs: &mut [Held], now: Micros) -> bool {
        match subs.iter_mut().find(|h| h.until > now && h.left > 0) {
            Some(h) => {
                h.left -= 1;
                true
            }
            None => false,
        }
    }

    /// The instance's ask: reports every sub-lease it is done with (spent out or
    /// expired), and drops them.
    fn region_ask(subs: &mut Vec<Held>, cost: u64, want: u64, credit: u64, now: Micros) -> PoolAsk {
        let (done, kept): (Vec<Held>, Vec<Held>) =
            subs.drain(..).partition(|h| h.left == 0 || h.until <= now);
        *subs = kept;
        PoolAsk {
            cost,
            low: want / 2 + 1,
            credit,
            want,
            done: done.into_iter().map(|h| (h.chunk, h.granted)).collect(),
        }
    }

    fn hold(subs: &mut Vec<Held>, got: &PoolTaken, now: Micros) {
        for part in &got.leases[0] {
            subs.push(Held {
                chunk: part.chunk.clone(),
                granted: part.tokens,
                left: part.tokens,
                until: now + part.life,
            });
        }
    }

    /// The global refill a pool take asked its caller for, if it did.
    fn pool_refill(
        got: &PoolTaken,
        g: usize,
        now: Micros,
        delay: Micros,
        n: usize,
    ) -> Option<Refill> {
        got.refill[0].then(|| Refill {
            take_at: now + delay,
            add_at: now + 2 * delay,
            sent: now,
            region: Some(g),
            instance: 0,
            id: format!("{}", n * 10 + 7),
            retire: got.retire[0].join(" "),
            unconfirmed: got.unconfirmed[0],
            taken: None,
            answered: false,
        })
    }

    /// The bounded-consistency design around one bucket: instances spend their own
    /// leases, or in a region the sub-leases they drew from its pool, else the
    /// pool itself or, holding none, the region's credit (charged to the
    /// global bucket by the next refill, into debt if need be); a miss is decided
    /// exactly by the global bucket; refills travel in the background (`delay` each
    /// way) and a pool chunk or an instance lease is spendable only until its global
    /// lease expires. The bound is split as the pipeline splits it: each of the 3
    /// regions gets `bound / 6` of credit, leases the rest. Returns the instants of
    /// every admission.
    fn simulate_system(
        cfg: &LeaseConfig,
        capacity: u64,
        delay: Micros,
        events: &[(Event, Micros)],
    ) -> (Vec<Micros>, usize) {
        let burst = capacity as i64 * T;
        let credit = cfg.max_overshoot / 6;
        let cfg = &LeaseConfig {
            max_overshoot: cfg.max_overshoot - 3 * credit,
            ..*cfg
        };
        let mut global = Central::default();
        let mut global_up = true;
        let mut exact_calls = 0;
        let mut pools: Vec<Pool> = vec![Pool::default(); 3];
        let mut subs: Vec<Vec<Held>> = vec![vec![]; 6];
        let mut leases: Vec<Option<LocalLease>> = vec![None; 4];
        let mut refilling = [false; 4];
        let mut pending: Vec<Refill> = vec![];
        let mut admitted = vec![];
        let mut now = 1_000_000;
        let want = cfg.max_lease;
        for (n, &(event, step)) in events.iter().enumerate() {
            now += step;
            // refills whose messages have arrived
            for r in pending.iter_mut() {
                if r.taken.is_none() && r.take_at <= now {
                    r.answered = global_up;
                    r.taken = Some(if global_up {
                        global.take_charging(
                            cfg,
                            r.take_at,
                            burst,
                            T,
                            r.unconfirmed,
                            want,
                            &r.id,
                            Some(&r.retire),
                            true,
                        )
                    } else {
                        Taken {
                            admitted: false,
                            leased: 0,
                            now: r.take_at,
                            full_at: 0,
                            expires_at: 0,
                            outstanding: 0,
                        }
                    });
                }
            }
            let (landed, rest): (Vec<_>, Vec<_>) =
                pending.into_iter().partition(|r| r.add_at <= now);
            pending = rest;
            for r in landed {
                let got = r.taken.expect("the take lands before the add");
                let member = if got.leased > 0 {
                    got.member(&r.id, T)
                } else {
                    String::new()
                };
                // spendable until the global lease expires, on the sender's reckoning
                let life = cfg.lifetime - (r.add_at - r.sent);
                match r.region {
                    Some(g) => {
                        // charged if the global store answered; released if the
                        // bucket was out of debt after the charge
                        let charged = if r.answered { r.unconfirmed } else { 0 };
                        let clear = r.answered && got.full_at - got.now <= burst;
                        pools[g].add(&member, got.leased, life, charged, clear, r.add_at);
                    }
                    None => {
                        refilling[r.instance] = false;
                        if got.leased > 0 {
                            leases[r.instance] = Some(LocalLease {
                                member,
                                tokens: got.leased,
                                granted: got.leased,
                                until: r.sent + cfg.lifetime,
                            });
                        }
                    }
                }
            }
            let mut exact = |global: &mut Central, up: bool| {
                exact_calls += 1;
                up && global.take(cfg, now, burst, T, 1, 0, "x", None).admitted
            };
            match event {
                Event::Global(up) => global_up = up,
                Event::Crash(i) => leases[i] = None,
                Event::Wipe(g) => {
                    pools[g] = Pool {
                        credit: pools[g].credit,
                        ..Pool::default()
                    }
                }
                Event::AtInstance(i) => {
                    let local = leases[i].as_mut().is_some_and(|l| l.spend(1, now));
                    if local || exact(&mut global, global_up) {
                        admitted.push(now);
                    }
                    let low = leases[i]
                        .as_ref()
                        .is_none_or(|l| l.tokens * 2 < want || !l.live(now + delay));
                    if low && !refilling[i] {
                        refilling[i] = true;
                        pending.push(Refill {
                            take_at: now + delay,
                            add_at: now + 2 * delay,
                            sent: now,
                            region: None,
                            instance: i,
                            id: format!("{}", n * 10 + i),
                            retire: String::new(),
                            unconfirmed: 0,
                            taken: None,
                            answered: false,
                        });
                    }
                }
                Event::Evict(x) => subs[x].clear(),
                Event::InRegion(x) => {
                    let g = x / 2;
                    if spend_sub(&mut subs[x], now) {
                        admitted.push(now);
                        if at_hand(&subs[x], now) * 2 < want {
                            // refilled ahead: a sub-lease alone (cost 0)
                            let ask = region_ask(&mut subs[x], 0, want, credit, now);
                            let got = Pool::take(&mut [&mut pools[g]], &[ask], now, 4 * delay, 0);
                            hold(&mut subs[x], &got, now);
                            pending.extend(pool_refill(&got, g, now, delay, n));
                        }
                        continue;
                    }
                    let ask = region_ask(&mut subs[x], 1, want, credit, now);
                    let got = Pool::take(&mut [&mut pools[g]], &[ask], now, 4 * delay, 0);
                    hold(&mut subs[x], &got, now);
                    if got.admitted || exact(&mut global, global_up) {
                        admitted.push(now);
                    }
                    pending.extend(pool_refill(&got, g, now, delay, n));
                }
            }
        }
        (admitted, exact_calls)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Instances and regions, instances holding sub-leases of their region's pool,
        /// random timing, refills in flight, crashes, evicted isolates, wiped pools
        /// and a global store that drops out: admissions in every window stay within
        /// capacity + refill × window + max_overshoot.
        #[test]
        fn regions_and_instances_never_overshoot_the_bound(
            capacity in 1u64..40,
            bound in 1u64..30,
            max_lease in 1u64..20,
            delay in 0i64..40_000,
            events in proptest::collection::vec(event(), 1..200),
        ) {
            let cfg = config(bound, max_lease);
            let (admitted, _) = simulate_system(&cfg, capacity, delay, &events);
            let excess = worst_excess(&admitted, capacity);
            prop_assert!(excess <= bound as i64, "excess {excess} > bound {bound}");
        }
    }

    #[test]
    fn pools_serve_a_steady_region_without_the_global_bucket() {
        // one region, a request every 20 ms (50/s against a bucket refilling 100/s),
        // refills taking 5 ms each way: nearly every request is served by the pool
        let cfg = LeaseConfig {
            lifetime: 1_000_000,
            ..config(20, 10)
        };
        let events: Vec<_> = (0..2_000).map(|_| (Event::InRegion(0), 20_000)).collect();
        let (admitted, exact_calls) = simulate_system(&cfg, 100, 5_000, &events);
        assert_eq!(
            admitted.len(),
            2_000,
            "a steady key below its rate is never refused"
        );
        assert!(
            exact_calls <= 10,
            "{exact_calls} requests paid a global round trip"
        );
        let mut pool = Pool::default();
        assert!(!Pool::take(&mut [&mut pool], &[ask(1, 1, 0)], 0, 10, 0).admitted);
    }

    fn ask(cost: u64, low: u64, credit: u64) -> PoolAsk {
        PoolAsk {
            cost,
            low,
            credit,
            ..PoolAsk::default()
        }
    }

    #[test]
    fn a_pool_spends_all_or_nothing_soonest_expiry_first_and_never_a_dead_chunk() {
        let (mut a, mut b) = (Pool::default(), Pool::default());
        assert_eq!(a.add("1:5:0", 5, 1_000, 0, true, 0), 5);
        assert_eq!(a.add("2:5:0", 5, 500, 0, true, 0), 10);
        b.add("3:1:0", 1, 1_000, 0, true, 0);
        // b holds 1 < 2 and has no credit: nothing is spent anywhere
        let got = Pool::take(
            &mut [&mut a, &mut b],
            &[ask(3, 0, 0), ask(2, 0, 0)],
            10,
            100,
            0,
        );
        assert!(!got.admitted);
        assert_eq!(got.left, [10, 1]);
        let got = Pool::take(
            &mut [&mut a, &mut b],
            &[ask(6, 5, 0), ask(1, 0, 0)],
            10,
            100,
            0,
        );
        assert!(got.admitted);
        assert_eq!(got.left, [4, 0]);
        // the chunk expiring first was spent out: the refiller retires it
        assert_eq!(
            got.refill,
            [true, false],
            "4 < 5: the caller refills, alone"
        );
        assert_eq!(got.retire[0], ["2:5:0".to_string()]);
        assert!(
            !Pool::take(&mut [&mut a], &[ask(1, 5, 0)], 20, 100, 0).refill[0],
            "locked"
        );
        assert_eq!(a.add("", 0, 0, 0, true, 30), 3);
        // at its expiry a chunk is gone, whatever it still held
        assert!(!Pool::take(&mut [&mut a], &[ask(1, 0, 0)], 1_000, 100, 0).admitted);
        assert!(a.chunks.is_empty());
        let reply = PoolTaken::from_reply(&[1, 7, 4, 1, 2, 1, 12, 3, 900, 0, 0, 0, 0, 0, 0], 2)
            .unwrap()
            .unwrap();
        assert_eq!(reply.refill, [true, false]);
        assert_eq!(reply.unconfirmed, [2, 0]);
        assert_eq!(reply.retire, [vec!["12:3:900".to_string()], vec![]]);
        assert_eq!(PoolTaken::from_reply(&[2, 7], 2).unwrap(), None);
        for bad in [
            &[1, 7, 4][..],
            &[1, 7, 4, 1, 0, 1, 12, 3, 0, 0, 0, 0, 0],
            &[1, 7, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9],
            &[1, 7, 4, 1, 0, 0, 1, 1, 2, 3, 4, 0, 0, 0, 0, 0],
        ] {
            assert!(PoolTaken::from_reply(bad, 2).is_err(), "{bad:?}");
        }
        assert_eq!(spent_members(&[12, 3, 900]).unwrap(), ["12:3:900"]);
        assert!(spent_members(&[12, 3]).is_err());
    }

    #[test]
    fn a_pool_is_refilled_before_its_chunks_die_not_after() {
        let chunk = |expires| Chunk {
            member: "1:10:0".into(),
            free: 10,
            out: 0,
            expires,
        };
        let mut p = Pool {
            chunks: vec![chunk(1_000)],
            ..Pool::default()
        };
        let low = ask(0, 5, 0);
        // plenty left and no horizon: no refill until the chunk is gone
        let got = Pool::take(&mut [&mut p], std::slice::from_ref(&low), 900, 10, 0);
        assert!(!got.refill[0]);
        // the chunk dies within the horizon: its tokens do not count, the caller
        // refills now, while the chunk still serves
        let got = Pool::take_ahead(&mut [&mut p], std::slice::from_ref(&low), 900, 10, 0, 200);
        assert!(got.refill[0]);
        assert_eq!(got.left, vec![10]);
        // a chunk that outlives the horizon counts
        let mut q = Pool {
            chunks: vec![chunk(2_000)],
            ..Pool::default()
        };
        assert!(!Pool::take_ahead(&mut [&mut q], &[low], 900, 10, 0, 200).refill[0]);
    }

    /// Two live chunks, the older still young: sub-leases draw the older one out
    /// first, so once its sub-leases are done it is retired (its room in the
    /// bound freed) while the newer serves. Drawn from the newer first, the older
    /// kept its remainder until it died, and a busy key's chunks filled the bound.
    #[test]
    fn a_young_chunk_is_drawn_out_first_and_retired() {
        let mut p = Pool::default();
        p.add("1:10:0", 10, 60_000, 0, true, 0);
        p.add("2:10:0", 10, 60_000, 0, true, 5_000);
        let sub = |want, done: &[(&str, u64)]| PoolAsk {
            want,
            done: done.iter().map(|(m, k)| (m.to_string(), *k)).collect(),
            ..ask(0, 0, 0)
        };
        let ahead = 15_000;
        let got = Pool::take_ahead(&mut [&mut p], &[sub(8, &[])], 6_000, 100, 50, ahead);
        assert_eq!(got.leases[0].len(), 1);
        assert_eq!(got.leases[0][0].chunk, "1:10:0", "the older, still young");
        let got = Pool::take_ahead(&mut [&mut p], &[sub(4, &[])], 7_000, 100, 50, ahead);
        let from: Vec<(&str, u64)> = got.leases[0]
            .iter()
            .map(|l| (l.chunk.as_str(), l.tokens))
            .collect();
        assert_eq!(from, [("1:10:0", 2), ("2:10:0", 2)]);
        // both of its sub-leases done: the older chunk is spent, retired with the
        // next refill
        let low = PoolAsk {
            low: 100,
            ..sub(0, &[("1:10:0", 8), ("1:10:0", 2)])
        };
        let got = Pool::take_ahead(&mut [&mut p], &[low], 8_000, 100, 50, ahead);
        assert!(got.refill[0]);
        assert_eq!(got.retire[0], ["1:10:0"]);
        // an old chunk (less than twice the horizon left) is drawn from last
        let mut q = Pool::default();
        q.add("3:10:0", 10, 20_000, 0, true, 0);
        q.add("4:10:0", 10, 60_000, 0, true, 0);
        let got = Pool::take_ahead(&mut [&mut q], &[sub(5, &[])], 1_000, 100, 50, ahead);
        assert_eq!(got.leases[0][0].chunk, "4:10:0");
    }

    #[test]
    fn a_chunk_is_retired_only_once_its_sub_leases_are_done() {
        let mut p = Pool::default();
        p.add("1:6:0", 6, 10_000, 0, true, 0);
        let sub = PoolAsk {
            want: 6,
            ..ask(0, 0, 0)
        };
        let got = Pool::take(&mut [&mut p], &[sub], 10, 100, 1_000);
        assert_eq!(
            got.leases[0],
            [SubLease {
                chunk: "1:6:0".into(),
                tokens: 6,
                life: 10_000 - 10 - 1_000
            }]
        );
        assert_eq!(got.left, [0]);
        // drained into a sub-lease: not spent while the sub-lease may still be spent
        let got = Pool::take(&mut [&mut p], &[ask(0, 1, 0)], 20, 100, 1_000);
        assert!(got.refill[0]);
        assert!(got.retire[0].is_empty(), "{:?}", got.retire);
        p.add("", 0, 0, 0, true, 30);
        // the holder reports it done: the next refiller retires the chunk
        let done = PoolAsk {
            done: vec![("1:6:0".into(), 6)],
            ..ask(0, 1, 0)
        };
        let got = Pool::take(&mut [&mut p], &[done], 40, 100, 1_000);
        assert_eq!(got.retire[0], ["1:6:0".to_string()]);
        // a chunk too close to its end leases nothing
        let mut q = Pool::default();
        q.add("2:5:0", 5, 1_500, 0, true, 0);
        let late = PoolAsk {
            want: 5,
            ..ask(0, 0, 0)
        };
        assert!(Pool::take(&mut [&mut q], &[late], 600, 100, 1_000).leases[0].is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Regions only, instances drawing sub-leases, evictions: the bound holds.
        #[test]
        fn sub_leases_never_overshoot_the_bound(
            capacity in 1u64..30,
            bound in 1u64..30,
            max_lease in 1u64..20,
            delay in 0i64..20_000,
            events in proptest::collection::vec(
                (prop_oneof![9 => (0usize..6).prop_map(Event::InRegion), 1 => (0usize..6).prop_map(Event::Evict)], 0i64..8_000),
                1..300,
            ),
        ) {
            let cfg = config(bound, max_lease);
            let (admitted, _) = simulate_system(&cfg, capacity, delay, &events);
            let excess = worst_excess(&admitted, capacity);
            prop_assert!(excess <= bound as i64, "excess {excess} > bound {bound}");
        }
    }

    #[test]
    fn a_pool_without_tokens_admits_on_credit_up_to_its_cap_until_charged() {
        let mut p = Pool::default();
        let first = Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 0, 100, 0);
        assert!(first.admitted, "on credit");
        assert_eq!((first.refill[0], first.unconfirmed[0]), (true, 1));
        assert!(Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 1, 100, 0).admitted);
        assert!(
            !Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 2, 100, 0).admitted,
            "cap 2"
        );
        // the refill charged 1 of the 2, the bucket out of debt, and brought 5 tokens
        p.add("9:5:0", 5, 1_000, 1, true, 3);
        assert_eq!((p.credit, p.uncharged), (1, 1));
        let got = Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 4, 100, 0);
        assert!(got.admitted);
        assert_eq!(got.left, [4], "from the chunk first");
        assert_eq!(
            got.unconfirmed,
            [1],
            "the rest of the credit is charged next"
        );
        // charged into debt: the credit stays used (no more for this key) until a
        // later charge finds the bucket out of debt
        p.add("", 0, 0, 1, false, 5);
        assert_eq!((p.credit, p.uncharged), (1, 0));
        p.chunks.clear();
        assert!(
            Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 6, 100, 0).admitted,
            "1 + 1 <= 2"
        );
        assert!(
            !Pool::take(&mut [&mut p], &[ask(1, 1, 2)], 7, 100, 0).admitted,
            "cap reached"
        );
        p.add("", 0, 0, 1, true, 8);
        assert_eq!((p.credit, p.uncharged), (0, 0), "out of debt: released");
    }

    #[test]
    fn the_overshoot_is_real_and_reaches_exactly_the_bound() {
        // A leases 10 tokens, the bucket refills to full, then in one instant A
        // spends its lease and B drains the bucket: capacity + 10 in a zero-length
        // window. A second lease past the bound is refused.
        let cfg = config(10, 10);
        let (capacity, burst) = (20u64, 20 * T);
        let mut c = Central::default();
        let t0 = 1_000_000;
        let a = c.take(&cfg, t0, burst, T, 1, 10, "a", None);
        assert_eq!((a.admitted, a.leased), (true, 10));
        let refused = c.take(&cfg, t0, burst, T, 1, 10, "b", None);
        assert_eq!(
            (refused.admitted, refused.leased),
            (true, 0),
            "bound reached"
        );
        let mut lease = LocalLease {
            member: a.member("a", T),
            tokens: a.leased,
            granted: a.leased,
            until: t0 + cfg.lifetime,
        };
        let t1 = t0 + 15 * T;
        let mut admitted = vec![t0, t0];
        while lease.spend(1, t1) {
            admitted.push(t1);
        }
        while c.take(&cfg, t1, burst, T, 1, 0, "b", None).admitted {
            admitted.push(t1);
        }
        assert_eq!(worst_excess(&admitted, capacity), 10);
    }

    #[test]
    fn leases_cut_calls_per_request() {
        let cfg = config(50, 5);
        // 2 instances, 83 requests/s together against 100/s: mostly local
        let events: Vec<_> = (0..400).map(|i| (i % 2, 12_000, false)).collect();
        let (admitted, admitted_exact, calls) = simulate(&cfg, 50, &events, 2);
        assert!(
            calls * 4 < events.len(),
            "{calls} calls for {} requests",
            events.len()
        );
        assert!(worst_excess(&admitted, 50) <= 50);
        // exact admitted its quota; leased mode admitted at most the bound more
        assert!(admitted.len() as i64 <= admitted_exact.len() as i64 + 50);
        assert!(admitted.len() * 10 >= admitted_exact.len() * 8);
    }

    #[test]
    fn a_return_refunds_only_what_the_bucket_still_owes() {
        let cfg = config(100, 50);
        let burst = 100 * T;
        let mut c = Central::default();
        let t0 = 1_000_000;
        // empty the bucket first: 50 exact, then a lease of 50
        let got = c.take(&cfg, t0, burst, T, 50, 50, "a", None);
        assert_eq!((got.admitted, got.leased), (true, 50));
        let member = got.member("a", T);
        let before = c.full_at;
        // give all back at once: the bucket is as if the lease never happened
        assert_eq!(c.give_back(t0, T, &member, 50), 50);
        assert_eq!(c.full_at, before - 50 * T);
        // a lease on a bucket that refills past its base refunds less
        let mut c = Central::default();
        let got = c.take(&cfg, t0, burst, T, 0, 10, "b", None);
        assert_eq!(got.leased, 10);
        let later = t0 + 4 * T; // 4 tokens of refill wasted (the bucket was full)
        assert_eq!(c.give_back(later, T, &got.member("b", T), 10), 6);
        // an expired lease refunds nothing
        let mut c = Central::default();
        let got = c.take(&cfg, t0, burst, T, 60, 10, "c", None);
        assert_eq!(
            c.give_back(t0 + cfg.lifetime, T, &got.member("c", T), 10),
            0
        );
    }

    #[test]
    fn lease_size_follows_the_rate_within_limits() {
        let cfg = config(100, 20);
        assert_eq!(cfg.lease_size(0), 1);
        assert_eq!(cfg.lease_size(100), 10); // 100/s × 0.1 s
        assert_eq!(cfg.lease_size(10_000), 20);
    }

    #[test]
    fn a_local_lease_stops_at_its_deadline_and_its_tokens() {
        let mut l = LocalLease {
            member: "m".into(),
            tokens: 2,
            granted: 2,
            until: 100,
        };
        assert!(l.spend(1, 10));
        assert!(!l.spend(2, 20));
        assert!(l.spend(1, 99));
        assert!(!l.spend(1, 99));
        l.tokens = 5;
        assert!(!l.spend(1, 100));
    }

    #[test]
    fn a_key_turns_leased_when_hot_and_exact_when_cool() {
        let cfg = config(100, 20); // hot at 100/s, cool at 20/s
        let mut s = ModeSwitch::default();
        let mut now = 5_000_000;
        // 50/s for 3 s: stays exact
        for _ in 0..150 {
            now += 20_000;
            assert_eq!(s.observe(&cfg, now, 1), Mode::Exact);
        }
        // 500/s: turns leased within the first second
        let mut turned = None;
        for i in 0..1000 {
            now += 2_000;
            if s.observe(&cfg, now, 1) == Mode::Leased {
                turned = Some(i);
                break;
            }
        }
        let turned = turned.expect("turns leased");
        assert!(turned < 500, "after {turned} requests");
        // 50/s (between cool and hot): stays leased (hysteresis)
        for _ in 0..3 {
            now += 20_000;
        }
        for _ in 0..100 {
            now += 20_000;
            assert_eq!(s.observe(&cfg, now, 1), Mode::Leased);
        }
        // 5/s: exact again once the sliding second has forgotten the 50/s
        let mut back = None;
        for i in 0..20 {
            now += 200_000;
            if s.observe(&cfg, now, 1) == Mode::Exact {
                back = Some(i);
                break;
            }
        }
        let back = back.expect("turns exact");
        assert!(back <= 10, "after {back} requests");
    }

    #[test]
    fn the_meter_counts_a_sliding_second() {
        let mut m = RateMeter::default();
        for i in 0..100 {
            m.record(10_000_000 + i * 10_000, 1);
        }
        assert_eq!(m.per_sec(10_999_999), 100);
        let mid = m.per_sec(11_500_000);
        assert!((49..=51).contains(&mid), "{mid}");
        assert_eq!(m.per_sec(13_000_000), 0);
    }
}
