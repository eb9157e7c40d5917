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
