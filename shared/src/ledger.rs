//! The regional ledger: a bounded policy's cold keys decided near the caller by
//! ONE plain command (issue 38).
//!
//! At fan-out — many instances, a long tail of keys — an instance has seldom
//! seen the key of a request lately, so it holds no sub-lease of it, and each
//! such request paid a pool take at its region's store (a script of four billed
//! commands) and often a refill (nine more): bounded cost more than exact. The
//! ledger decides such a request with `HINCRBY <ledger> <field> <cost>` at the
//! region's store (one billed command, no script): the key's count of requests
//! its region admitted since the ledger was last charged; admitted while the
//! count stays within the region's [`share`], else the request goes to the pool
//! as before (and the increment is taken back).
//!
//! **Charged in bulk.** Every [`SETTLE_EVERY`], one instance per region (the one
//! that takes [`LOCK_KEY`]) charges the ledger to the global buckets: the ledger
//! is renamed to [`SETTLING_KEY`] and read (`lua/ledger_take.lua`), every bucket
//! with a count is charged at the global store in ONE call
//! (`lua/ledger_charge.lua`: into debt if need be, [`charged`]), and the settled
//! ledger is dropped; a bucket the charge left in debt is blocked in the new
//! ledger ([`BLOCKED`] added to its count: every request of it overflows to the
//! pool, whose refill the global bucket refuses, until a later charge finds the
//! debt repaid) (`lua/ledger_done.lua`). A settler that dies half way leaves
//! [`SETTLING_KEY`]: the next one charges it first (at worst twice: a shortfall).
//!
//! **The bound.** What a region admitted and has not charged is its ledger and
//! the one being settled: at most 2 × [`share`] per key. With `regions` regions
//! that is `max_overshoot / (8 × regions)` × `regions` … half the credit the
//! regions held before (`max_overshoot / 4` in all): the pools' credit is the
//! other half, and the global store's leases are what both leave, as before.

use crate::script::LuaScript;
use crate::time::{MICROS_PER_SEC, Micros};

/// `lua/ledger_take.lua`: renames a region's ledger for its settlement and reads it.
pub const LEDGER_TAKE: LuaScript = LuaScript {
    source: crate::lease::sha::LEDGER_TAKE_SOURCE,
    sha1: crate::lease::sha::LEDGER_TAKE_SHA1,
};
/// `lua/ledger_charge.lua`: charges the settled counts to the global buckets.
pub const LEDGER_CHARGE: LuaScript = LuaScript {
    source: crate::lease::sha::LEDGER_CHARGE_SOURCE,
    sha1: crate::lease::sha::LEDGER_CHARGE_SHA1,
};
/// `lua/ledger_done.lua`: drops the settled ledger, blocks the buckets in debt.
pub const LEDGER_DONE: LuaScript = LuaScript {
    source: crate::lease::sha::LEDGER_DONE_SOURCE,
    sha1: crate::lease::sha::LEDGER_DONE_SHA1,
};

/// The ledger of a region's store: a hash of [`Field`] → count.
pub const LEDGER_KEY: &str = "fg:ledger";
/// The ledger being charged (renamed from [`LEDGER_KEY`] by its settler).
pub const SETTLING_KEY: &str = "fg:ledger:settling";
/// Who settles a region's ledger this interval (`SET NX PX`).
pub const LOCK_KEY: &str = "fg:ledger:lock";
/// How often a region's ledger is charged to the global store.
pub const SETTLE_EVERY: Micros = 10 * MICROS_PER_SEC;
/// Added to a blocked bucket's count: far above any share, far below 2^53.
pub const BLOCKED: i64 = 1 << 40;

/// What one region may admit per key of a policy with `max_overshoot` in one
/// settle interval before it is charged: `max_overshoot / (16 × regions)` (0:
/// no ledger: too small a bound, or no regions).
pub fn share(max_overshoot: u64, regions: u32) -> u64 {
    if regions == 0 {
        return 0;
    }
    max_overshoot / (16 * u64::from(regions))
}

/// A ledger's field: the bucket, with what charging it takes (its µs per token
/// and burst window), so the settler needs no configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub bucket: String,
    pub emission: Micros,
    pub burst: Micros,
}

impl Field {
    /// `<bucket>\t<emission>\t<burst>` (a bucket key holds no tab).
    pub fn encode(&self) -> String {
        format!("{}\t{}\t{}", self.bucket, self.emission, self.burst)
    }

    /// The field [`Field::encode`] wrote (`None`: not one).
    pub fn decode(text: &str) -> Option<Field> {
        let mut parts = text.rsplitn(3, '\t');
        let burst = parts.next()?.parse().ok().filter(|b: &Micros| *b > 0)?;
        let emission = parts.next()?.parse().ok().filter(|e: &Micros| *e > 0)?;
        let bucket = parts.next().filter(|b| !b.is_empty())?.to_string();
        Some(Field {
            bucket,
            emission,
            burst,
        })
    }
}

/// A ledger count as read: what to charge, and whether the bucket was blocked.
pub fn count_of(raw: i64) -> (u64, bool) {
    if raw >= BLOCKED {
        ((raw - BLOCKED).max(0) as u64, true)
    } else {
        (raw.max(0) as u64, false)
    }
}

/// The pure twin of `lua/ledger_charge.lua` for one bucket: its full_at after
/// `count` tokens are charged at `now` (into debt if need be).
pub fn charged(full_at: Option<Micros>, now: Micros, emission: Micros, count: u64) -> Micros {
    full_at.unwrap_or(0).max(now) + count as Micros * emission
}

/// Whether a bucket of `burst` with `full_at` is in debt at `now`.
pub fn in_debt(full_at: Micros, now: Micros, burst: Micros) -> bool {
    full_at - now > burst
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_field_round_trips_and_garbage_is_none() {
        let f = Field {
            bucket: "fg:{k:ab}:search:e:x".into(),
            emission: 6_000,
            burst: 60_000_000,
        };
        assert_eq!(Field::decode(&f.encode()), Some(f));
        for bad in ["", "x", "a\t1", "a\t0\t5", "\t1\t2", "a\t1\t-2", "a\tz\t2"] {
            assert_eq!(Field::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_share_is_a_sixteenth_of_the_bound_per_region() {
        assert_eq!(share(500, 2), 15);
        assert_eq!(share(500, 0), 0);
        assert_eq!(share(20, 2), 0, "too small a bound: no ledger");
    }

    proptest! {
        /// Two regions' ledgers and their settling copies never hold more than
        /// the quarter of the bound they are given, whatever the interleaving of
        /// admissions (each within the share) and settlements.
        #[test]
        fn uncharged_admissions_stay_within_a_quarter_of_the_bound(
            bound in 32u64..5_000,
            steps in prop::collection::vec((0usize..2, any::<bool>()), 1..400),
        ) {
            let regions = 2u32;
            let s = share(bound, regions);
            // per region: (ledger, settling)
            let mut r = [(0u64, 0u64); 2];
            for (region, settle) in steps {
                let (ledger, settling) = &mut r[region];
                if settle {
                    // the settler charges what was settling, renames the ledger
                    *settling = std::mem::take(ledger);
                } else if *ledger < s {
                    *ledger += 1;
                }
                let uncharged: u64 = r.iter().map(|(l, s)| l + s).sum();
                prop_assert!(uncharged <= bound / 4, "{uncharged} > {}", bound / 4);
            }
        }

        #[test]
        fn a_charge_moves_full_at_by_the_tokens_from_now_or_later(
            full_at in prop::option::of(0i64..1_000_000_000),
            now in 0i64..1_000_000_000,
            t in 1i64..10_000_000,
            count in 0u64..1_000,
        ) {
            let after = charged(full_at, now, t, count);
            prop_assert_eq!(after - full_at.unwrap_or(0).max(now), count as i64 * t);
            prop_assert!(!in_debt(charged(None, now, t, 0), now, 1));
        }
    }
}
