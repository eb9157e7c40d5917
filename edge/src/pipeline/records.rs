//! What the pipeline keeps in memory between requests: the configuration and API
//! key records read from the store, and the budget of lookups that found no key.
//!
//! A record stays good as long as the records' revision (`shared::changes`) has
//! not moved: every decision the instance asks the store for tells the revision,
//! and otherwise one read of it per TTL confirms every record held at once. So a
//! record is **fresh** for a TTL after it was read or last confirmed, then
//! **stale** for one more TTL (served while the revision is checked in the
//! background), then **old** (read again on the request's path; served however
//! old through outages). A moved revision names what changed, and only that is
//! read again ([`Records::observe`]). Without a readable revision, a record is
//! good for a TTL after it was read, as if every check said "changed". Whatever
//! the revision says, a known key is read again `max_age` after it was read (a
//! writer that does not bump the revision is still seen), an unknown one
//! `negative_ttl` after.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::time::Micros;
use rustc_hash::FxBuildHasher;

use crate::bounded_map::{BoundedMap, WhenFull};
use crate::sync::lock;

/// A cached value, read at `read_at`, good (whatever the revision says) until
/// `until`.
struct Cached<T> {
    value: T,
    read_at: Micros,
    until: Micros,
    /// Kept fresh by the revision's confirmations (an unknown key is not: it is
    /// good for its own lifetime, `negative_ttl`, whatever the revision says).
    confirmable: bool,
    /// The records' revision it was read with, when known.
    rev: Option<u64>,
    /// When a read of it again was claimed (one at a time).
    claimed: Option<Micros>,
}

impl<T> Cached<T> {
    fn new(value: T, read_at: Micros, until: Micros, confirmable: bool, rev: Option<u64>) -> Self {
        Self {
            value,
            read_at,
            until,
            confirmable,
            rev,
            claimed: None,
        }
    }

    /// Claims the read of a value past its own lifetime: `true` for the first
    /// caller, and again once a claim is older than `lost_after` (its read never
    /// came back).
    fn claim(&mut self, now: Micros, lost_after: Micros) -> bool {
        let free = self.claimed.is_none_or(|at| now - at >= lost_after);
        if self.until <= now && free {
            self.claimed = Some(now);
            return true;
        }
        false
    }
}

/// A cache lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    Fresh(T),
    /// Past its freshness by less than one more TTL: serve it, and revalidate it
    /// in the background (stale-while-revalidate).
    Stale(T),
    /// Older: read it again before answering; serve it only if the store cannot
    /// answer. (An instance idle for a while never admits on a record older than
    /// two TTLs: a revocation is seen within them.)
    Old(T),
    Missing,
}

impl<T> Lookup<T> {
    /// Whatever is cached, however old.
    pub fn any(self) -> Option<T> {
        match self {
            Lookup::Fresh(v) | Lookup::Stale(v) | Lookup::Old(v) => Some(v),
            Lookup::Missing => None,
        }
    }
}

/// What the instance knows of the records' revision.
#[derive(Debug, Default)]
struct Rev {
    /// The revision every record held is consistent with (`None`: unknown).
    known: Option<u64>,
    /// When the store last said the revision was still `known`.
    confirmed_at: Option<Micros>,
    /// A revision check, and a read of what changed, in flight (when claimed).
    checking: Option<Micros>,
    syncing: Option<Micros>,
}

/// What a revision the store told means for the records held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Unchanged: every record held is confirmed.
    Same,
    /// Changed (or unknown) from `known`: what changed is to be read again, by
    /// this caller ([`Records::synced`] when done, [`Records::release_sync`] on
    /// failure).
    Sync { known: Option<u64> },
    /// Changed, and a read of what changed is already in flight.
    Syncing,
}

/// Key records (`None`: no such key) by the secret's SHA-256 (hex): uniform
/// whatever secrets are sent, so a fast hash serves (no one can choose
/// collisions).
type KeyCache = BoundedMap<String, Cached<Option<Arc<KeyRecord>>>, FxBuildHasher>;

/// The configuration and key records, cached.
pub struct Records {
    config: Mutex<Option<Cached<Arc<EdgeConfig>>>>,
    keys: Mutex<KeyCache>,
    rev: Mutex<Rev>,
    guess: Mutex<Guess>,
    ttl: Micros,
    negative_ttl: Micros,
    max_age: Micros,
}

/// What the key records this instance read lately had in common: the plan of
/// the last [`GUESS_AFTER`] (or more) read in a row, none with an identity or
/// credits (`super::unseen` decides a key not read yet on that guess).
#[derive(Debug, Default)]
struct Guess {
    plan: String,
    streak: u32,
}

/// Key records of one plan (no identity, no credits) read in a row before an
/// unseen key is guessed to be on it: a wrong guess costs a call and its
/// refund, a right one saves a read, so it pays where nearly every key is
/// ([`Records::guess`]).
pub const GUESS_AFTER: u32 = 8;

impl Records {
    /// Records are fresh for `ttl` after they were read or confirmed, known keys
    /// read again after `max_age` whatever the revision says, unknown keys after
    /// `negative_ttl`; at most `max_keys` key records (known and unknown) are held.
    pub fn new(ttl: Micros, negative_ttl: Micros, max_age: Micros, max_keys: usize) -> Self {
        Self {
            config: Mutex::new(None),
            keys: Mutex::new(BoundedMap::new(max_keys, WhenFull::Clear)),
            rev: Mutex::new(Rev::default()),
            guess: Mutex::new(Guess::default()),
            ttl,
            negative_ttl,
            max_age: max_age.max(ttl),
        }
    }

    /// `c` at `now`: fresh for a TTL after it was read or confirmed (never past
    /// its own lifetime), stale for one more TTL, then old.
    fn look<T: Clone>(&self, c: Option<&Cached<T>>, now: Micros) -> Lookup<T> {
        let Some(c) = c else {
            return Lookup::Missing;
        };
        let fresh_until = if c.confirmable {
            let confirmed = lock(&self.rev).confirmed_at.unwrap_or(Micros::MIN);
            c.until.min(c.read_at.max(confirmed) + self.ttl)
        } else {
            c.until
        };
        if now < fresh_until {
            Lookup::Fresh(c.value.clone())
        } else if now < fresh_until + self.ttl {
            Lookup::Stale(c.value.clone())
        } else {
            Lookup::Old(c.value.clone())
        }
    }

    pub fn config(&self, now: Micros) -> Lookup<Arc<EdgeConfig>> {
        self.look(lock(&self.config).as_ref(), now)
    }

    /// Caches the configuration read at `now` with revision `rev`.
    pub fn set_config(&self, config: Arc<EdgeConfig>, now: Micros, rev: Option<u64>) {
        *lock(&self.config) = Some(Cached::new(config, now, now + self.max_age, true, rev));
    }

    /// The stored configuration was read and is unusable: the one in use stays,
    /// good for another TTL (read again then, not on every request).
    pub fn keep_config(&self, now: Micros, rev: Option<u64>) {
        if let Some(c) = lock(&self.config).as_mut() {
            c.rev = rev;
            c.read_at = now;
            c.until = now + self.ttl;
            c.claimed = None;
        }
    }

    /// Whether the configuration is past its own lifetime: read it again (not
    /// only the revision) to revalidate it.
    pub fn config_expired(&self, now: Micros) -> bool {
        lock(&self.config).as_ref().is_some_and(|c| c.until <= now)
    }

    /// Claims the read of a configuration past its own lifetime (one at a time;
    /// a claim a TTL old counts as lost).
    pub fn claim_config(&self, now: Micros) -> bool {
        lock(&self.config)
            .as_mut()
            .is_some_and(|c| c.claim(now, self.ttl))
    }

    /// The configuration's read failed: the next stale lookup tries again.
    pub fn release_config(&self) {
        if let Some(c) = lock(&self.config).as_mut() {
            c.claimed = None;
        }
    }

    /// Whether the key record of `hash` is past its own lifetime.
    pub fn key_expired(&self, hash: &str, now: Micros) -> bool {
        lock(&self.keys).get(hash).is_some_and(|c| c.until <= now)
    }

    /// Claims the read of a key record past its own lifetime, like
    /// [`Records::claim_config`].
    pub fn claim_key(&self, hash: &str, now: Micros) -> bool {
        lock(&self.keys)
            .get_mut(hash)
            .is_some_and(|c| c.claim(now, self.ttl))
    }

    /// A key record's read failed: the next stale lookup tries again.
    pub fn release_key(&self, hash: &str) {
        if let Some(c) = lock(&self.keys).get_mut(hash) {
            c.claimed = None;
        }
    }

    /// The record of the key whose secret hashes to `hash` (`Some(None)`: known to
    /// be no key).
    pub fn key(&self, hash: &str, now: Micros) -> Lookup<Option<Arc<KeyRecord>>> {
        self.look(lock(&self.keys).get(hash), now)
    }

    /// Drops the key record of `hash`: the next request reads it on its path.
    pub fn forget_key(&self, hash: &str) {
        lock(&self.keys).remove(hash);
    }

    /// Caches the key record of `hash` (`None`: no such key) read at `now` with
    /// revision `rev`.
    pub fn set_key(
        &self,
        hash: String,
        record: Option<Arc<KeyRecord>>,
        now: Micros,
        rev: Option<u64>,
    ) {
        let known = record.is_some();
        self.learn_plan(record.as_deref());
        let life = if known {
            self.max_age
        } else {
            self.negative_ttl
        };
        lock(&self.keys).insert(
            hash,
            Cached::new(record, now, now + life, known, rev),
            |c| c.until > now,
        );
    }

    /// The plan an unseen key is most likely on: the one of the last
    /// [`GUESS_AFTER`] records read or more, if they all had it (and no identity
    /// or credits).
    pub fn guess(&self) -> Option<String> {
        let g = lock(&self.guess);
        (g.streak >= GUESS_AFTER).then(|| g.plan.clone())
    }

    /// A record read (`None`: no such key, which says nothing of plans).
    fn learn_plan(&self, record: Option<&KeyRecord>) {
        let Some(r) = record else { return };
        let mut g = lock(&self.guess);
        if r.identity.is_some() || r.credits.is_some() {
            g.streak = 0;
        } else if g.plan == r.plan {
            g.streak = g.streak.saturating_add(1);
        } else {
            (g.plan, g.streak) = (r.plan.clone(), 1);
        }
    }

    /// Caches the existing key record of `hash` read at `now` with revision
    /// `rev` when no record of it is held and the cache has room (a record
    /// prefetched, [`super::copies`]): whether it was.
    pub fn adopt_key(
        &self,
        hash: String,
        record: Arc<KeyRecord>,
        now: Micros,
        rev: Option<u64>,
    ) -> bool {
        let mut keys = lock(&self.keys);
        if !keys.has_room() || keys.contains_key(&hash) {
            return false;
        }
        keys.insert(
            hash,
            Cached::new(Some(record), now, now + self.max_age, true, rev),
            |_| true,
        )
    }

    /// The hashes of the key records held (known and unknown keys) not read with
    /// revision `rev`.
    pub fn keys_behind(&self, rev: Option<u64>) -> Vec<String> {
        lock(&self.keys)
            .iter()
            .filter(|(_, c)| rev.is_none() || c.rev != rev)
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Whether a configuration is held that was not read with revision `rev`.
    pub fn config_behind(&self, rev: Option<u64>) -> bool {
        lock(&self.config)
            .as_ref()
            .is_some_and(|c| rev.is_none() || c.rev != rev)
    }

    /// The store said the revision is `seen` (`None`: missing or unreadable) at
    /// `now`. Unchanged: every record held is confirmed. Otherwise the caller is
    /// to read what changed ([`Observed::Sync`]) unless another one is.
    pub fn observe(&self, seen: Option<u64>, now: Micros) -> Observed {
        let mut rev = lock(&self.rev);
        if seen.is_some() && seen == rev.known {
            rev.confirmed_at = Some(now);
            return Observed::Same;
        }
        if rev.syncing.is_some_and(|at| now - at < self.ttl) {
            return Observed::Syncing;
        }
        rev.syncing = Some(now);
        Observed::Sync { known: rev.known }
    }

    /// The records' revision this instance confirmed at the global store within
    /// `fresh` of `now`, if it did.
    pub fn confirmed(&self, now: Micros, fresh: Micros) -> Option<u64> {
        let rev = lock(&self.rev);
        let at = rev.confirmed_at?;
        rev.known.filter(|_| (0..=fresh).contains(&(now - at)))
    }

    /// What changed was read again: the records are consistent with revision
    /// `now_rev` (confirmed at `now` when it is a number).
    pub fn synced(&self, now_rev: Option<u64>, now: Micros) {
        let mut rev = lock(&self.rev);
        rev.known = now_rev;
        rev.confirmed_at = now_rev.map(|_| now);
        rev.syncing = None;
    }

    /// A read of what changed failed: the next observation tries again.
    pub fn release_sync(&self) {
        lock(&self.rev).syncing = None;
    }

    /// Claims the background check of the revision, due when the records were
    /// last confirmed more than a TTL ago (one check at a time; a claim a TTL old
    /// counts as lost).
    pub fn claim_check(&self, now: Micros) -> bool {
        let mut rev = lock(&self.rev);
        let due = rev.confirmed_at.is_none_or(|at| now - at >= self.ttl);
        let free = rev.checking.is_none_or(|at| now - at >= self.ttl);
        if due && free {
            rev.checking = Some(now);
        }
        due && free
    }

    /// The revision check is over (answered or failed).
    pub fn release_check(&self) {
        lock(&self.rev).checking = None;
    }
}

/// Where a failed lookup is charged: its client's address, and the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Payer {
    Address(Option<IpAddr>),
    Instance,
}

/// Lookups of keys that turn out not to exist cost a Redis read each (a billed
/// command on Upstash), and their secrets are random, so no cache can stop a
/// flood of them. This budget can: every lookup that finds no key is charged to
/// its client's address and to the instance, and while either budget is spent
/// the edge refuses uncached keys without asking the store. Keys already cached
/// (valid or known unknown) never touch it; found keys are never charged.
pub struct UnknownKeyBudget {
    per_address: Option<Quota>,
    per_instance: Option<Quota>,
    spent: Mutex<BoundedMap<Payer, BucketState>>,
}

/// Most addresses tracked at once (full buckets are dropped first).
const MAX_PAYERS: usize = 100_000;

impl UnknownKeyBudget {
    /// At most `per_address_per_min` failed lookups a minute per client address
    /// and `per_instance_per_min` per instance (0: no limit), each with a burst of
    /// the same size.
    pub fn new(per_address_per_min: u32, per_instance_per_min: u32) -> Self {
        let quota = |n: u32| {
            (n > 0)
                .then(|| Quota::per_minute(u64::from(n)).ok())
                .flatten()
        };
        Self {
            per_address: quota(per_address_per_min),
            per_instance: quota(per_instance_per_min),
            spent: Mutex::new(BoundedMap::new(MAX_PAYERS, WhenFull::Refuse)),
        }
    }

    fn payers(&self, ip: Option<IpAddr>) -> impl Iterator<Item = (Payer, &Quota)> {
        [
            self.per_address.as_ref().map(|q| (Payer::Address(ip), q)),
            self.per_instance.as_ref().map(|q| (Payer::Instance, q)),
        ]
        .into_iter()
        .flatten()
    }

    /// `Ok` when a lookup from `ip` may go to the store; else how long until one
    /// may (µs).
    pub fn room(&self, ip: Option<IpAddr>, now: Micros) -> Result<(), Micros> {
        let spent = lock(&self.spent);
        let wait = self
            .payers(ip)
            .filter_map(
                |(p, q)| match decide(spent.get(&p).copied(), q, now, 1).decision.outcome {
                    floodgate_shared::Admission::Allowed => None,
                    floodgate_shared::Admission::Denied { retry_after } => {
                        Some(retry_after.unwrap_or(1))
                    }
                },
            )
            .max();
        wait.map_or(Ok(()), Err)
    }

    /// Charges one lookup that found no key.
    pub fn charge(&self, ip: Option<IpAddr>, now: Micros) {
        let mut spent = lock(&self.spent);
        let payers: Vec<(Payer, Quota)> = self.payers(ip).map(|(p, q)| (p, *q)).collect();
        for (p, q) in payers {
            // a spent budget stays spent (the charge is dropped, not queued)
            if let Some(w) = decide(spent.get(&p).copied(), &q, now, 1).write {
                spent.insert(p, w, |s| s.full_at > now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_764_000_000_000_000;
    const SEC: Micros = 1_000_000;

    #[test]
    fn records_are_fresh_then_stale_and_unknown_keys_live_longer() {
        let r = Records::new(5 * SEC, 60 * SEC, 5 * SEC, 10);
        assert_eq!(r.key("h", T0), Lookup::Missing);
        r.set_key("h".into(), None, T0, None);
        assert_eq!(r.key("h", T0 + 59 * SEC), Lookup::Fresh(None));
        assert_eq!(r.key("h", T0 + 61 * SEC), Lookup::Stale(None));
        assert_eq!(
            r.key("h", T0 + 65 * SEC),
            Lookup::Old(None),
            "stale for one more TTL (5 s), then old"
        );
        let config = Arc::new(EdgeConfig::from_json(
            r#"{"policies":[{"name":"p","dimensions":["api_key"],"quota":{"capacity":1,"period":"1s"},"failure_mode":"fail_open"}],"plans":{"free":["p"]}}"#,
        )
        .unwrap());
        r.set_config(config.clone(), T0, None);
        assert!(matches!(r.config(T0 + SEC), Lookup::Fresh(_)));
        assert!(matches!(r.config(T0 + 6 * SEC), Lookup::Stale(_)));
        assert!(matches!(r.config(T0 + 10 * SEC), Lookup::Old(_)));
    }

    #[test]
    fn one_refresh_of_a_stale_record_at_a_time_until_it_is_lost_or_released() {
        let r = Records::new(5 * SEC, 60 * SEC, 5 * SEC, 10);
        assert!(!r.claim_key("h", T0), "nothing cached: nothing to refresh");
        r.set_key("h".into(), None, T0, None);
        assert!(!r.claim_key("h", T0 + SEC), "fresh");
        assert!(r.claim_key("h", T0 + 61 * SEC));
        assert!(!r.claim_key("h", T0 + 62 * SEC), "one at a time");
        r.release_key("h");
        assert!(r.claim_key("h", T0 + 62 * SEC), "released after a failure");
        assert!(r.claim_key("h", T0 + 67 * SEC), "a claim a TTL old is lost");
        r.set_key("h".into(), None, T0 + 68 * SEC, None);
        assert!(!r.claim_key("h", T0 + 69 * SEC), "refreshed");
        assert!(!r.claim_config(T0));
        let config = Arc::new(
            EdgeConfig::from_json(
                r#"{"policies":[{"name":"p","dimensions":["api_key"],"quota":{"capacity":1,"period":"1s"},"failure_mode":"fail_open"}],"plans":{"free":["p"]}}"#,
            )
            .unwrap(),
        );
        r.set_config(config, T0, None);
        assert!(!r.claim_config(T0 + SEC));
        assert!(r.claim_config(T0 + 6 * SEC));
        assert!(!r.claim_config(T0 + 7 * SEC));
        r.release_config();
        assert!(r.claim_config(T0 + 7 * SEC));
    }

    #[test]
    fn the_key_cache_is_bounded() {
        let r = Records::new(5 * SEC, 5 * SEC, 5 * SEC, 3);
        for i in 0..10 {
            r.set_key(format!("k{i}"), None, T0, None);
        }
        let held = (0..10)
            .filter(|i| r.key(&format!("k{i}"), T0) != Lookup::Missing)
            .count();
        assert!(held <= 3, "{held}");
        assert_eq!(r.key("k9", T0), Lookup::Fresh(None));
    }

    #[test]
    fn failed_lookups_spend_the_address_and_the_instance_budgets() {
        let b = UnknownKeyBudget::new(3, 5);
        let a: IpAddr = "203.0.113.1".parse().unwrap();
        let c: IpAddr = "203.0.113.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(b.room(Some(a), T0), Ok(()));
            b.charge(Some(a), T0);
        }
        let wait = b.room(Some(a), T0).unwrap_err();
        assert!(
            (1..=20 * SEC).contains(&wait),
            "one lookup returns after 20 s: {wait}"
        );
        // another address still has room, until the instance's budget is spent too
        for _ in 0..2 {
            assert_eq!(b.room(Some(c), T0), Ok(()));
            b.charge(Some(c), T0);
        }
        assert!(b.room(Some(c), T0).is_err(), "the instance's 5 are spent");
        assert!(b.room(None, T0).is_err());
        // a minute later everything is back
        assert_eq!(b.room(Some(a), T0 + 60 * SEC), Ok(()));
        let off = UnknownKeyBudget::new(0, 0);
        for _ in 0..1000 {
            off.charge(Some(a), T0);
        }
        assert_eq!(off.room(Some(a), T0), Ok(()));
    }
}
