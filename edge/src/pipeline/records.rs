//! What the pipeline keeps in memory between requests: the configuration and API
//! key records read from the store (fresh for a TTL, then for one more TTL served
//! stale while one background refresh runs; older, read again on the request's
//! path, and served however old through outages; known unknown keys for longer),
//! and the budget of lookups that found no key.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use floodgate_shared::apikeys::KeyRecord;
use floodgate_shared::bucket::{BucketState, decide};
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::policy::Quota;
use floodgate_shared::time::Micros;

use crate::sync::lock;

/// A cached value: fresh until `until`, then stale (served while it is refreshed,
/// and while the store is unreachable).
struct Cached<T> {
    value: T,
    until: Micros,
    /// When a refresh of the stale value was claimed (one at a time).
    claimed: Option<Micros>,
}

impl<T> Cached<T> {
    fn new(value: T, until: Micros) -> Self {
        Self {
            value,
            until,
            claimed: None,
        }
    }

    /// Claims the refresh of a stale value: `true` for the first caller, and again
    /// once a claim is older than `lost_after` (its refresh never came back).
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
    /// Past its TTL by less than one more TTL: serve it, and refresh it in the
    /// background (stale-while-revalidate).
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

/// `c` at `now`: fresh until its expiry, then stale for `window` more, then old.
fn look<T: Clone>(c: Option<&Cached<T>>, now: Micros, window: Micros) -> Lookup<T> {
    match c {
        Some(c) if c.until > now => Lookup::Fresh(c.value.clone()),
        Some(c) if c.until + window > now => Lookup::Stale(c.value.clone()),
        Some(c) => Lookup::Old(c.value.clone()),
        None => Lookup::Missing,
    }
}

/// The configuration and key records, cached.
pub struct Records {
    config: Mutex<Option<Cached<Arc<EdgeConfig>>>>,
    keys: Mutex<HashMap<String, Cached<Option<KeyRecord>>>>,
    ttl: Micros,
    negative_ttl: Micros,
    max_keys: usize,
}

impl Records {
    /// Records stay fresh for `ttl`; keys found unknown for `negative_ttl`; at most
    /// `max_keys` key records (known and unknown) are held.
    pub fn new(ttl: Micros, negative_ttl: Micros, max_keys: usize) -> Self {
        Self {
            config: Mutex::new(None),
            keys: Mutex::new(HashMap::new()),
            ttl,
            negative_ttl,
            max_keys: max_keys.max(1),
        }
    }

    pub fn config(&self, now: Micros) -> Lookup<Arc<EdgeConfig>> {
        look(lock(&self.config).as_ref(), now, self.ttl)
    }

    pub fn set_config(&self, config: Arc<EdgeConfig>, now: Micros) {
        *lock(&self.config) = Some(Cached::new(config, now + self.ttl));
    }

    /// Claims the refresh of the stale configuration: `true` when this caller is
    /// to refresh it (one refresh at a time; a claim a TTL old counts as lost).
    pub fn claim_config(&self, now: Micros) -> bool {
        lock(&self.config)
            .as_mut()
            .is_some_and(|c| c.claim(now, self.ttl))
    }

    /// The stored configuration was read and is unusable: the one in use stays,
    /// fresh for another TTL (read again then, not on every request).
    pub fn keep_config(&self, now: Micros) {
        if let Some(c) = lock(&self.config).as_mut() {
            c.until = now + self.ttl;
            c.claimed = None;
        }
    }

    /// The configuration's refresh failed: the next stale lookup tries again.
    pub fn release_config(&self) {
        if let Some(c) = lock(&self.config).as_mut() {
            c.claimed = None;
        }
    }

    /// Claims the refresh of a stale key record, like [`Records::claim_config`].
    pub fn claim_key(&self, hash: &str, now: Micros) -> bool {
        lock(&self.keys)
            .get_mut(hash)
            .is_some_and(|c| c.claim(now, self.ttl))
    }

    /// A key record's refresh failed: the next stale lookup tries again.
    pub fn release_key(&self, hash: &str) {
        if let Some(c) = lock(&self.keys).get_mut(hash) {
            c.claimed = None;
        }
    }

    /// The record of the key whose secret hashes to `hash` (`Some(None)`: known to
    /// be no key).
    pub fn key(&self, hash: &str, now: Micros) -> Lookup<Option<KeyRecord>> {
        look(lock(&self.keys).get(hash), now, self.ttl)
    }

    pub fn set_key(&self, hash: String, record: Option<KeyRecord>, now: Micros) {
        let ttl = if record.is_some() {
            self.ttl
        } else {
            self.negative_ttl
        };
        let mut keys = lock(&self.keys);
        if keys.len() >= self.max_keys && !keys.contains_key(&hash) {
            keys.retain(|_, c| c.until > now);
            if keys.len() >= self.max_keys {
                keys.clear();
            }
        }
        keys.insert(hash, Cached::new(record, now + ttl));
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
    spent: Mutex<HashMap<Payer, BucketState>>,
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
            spent: Mutex::new(HashMap::new()),
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
        if spent.len() >= MAX_PAYERS {
            spent.retain(|_, s| s.full_at > now);
        }
        let payers: Vec<(Payer, Quota)> = self.payers(ip).map(|(p, q)| (p, *q)).collect();
        for (p, q) in payers {
            // a spent budget stays spent (the charge is dropped, not queued)
            if let Some(w) = decide(spent.get(&p).copied(), &q, now, 1).write
                && (spent.len() < MAX_PAYERS || spent.contains_key(&p))
            {
                spent.insert(p, w);
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
        let r = Records::new(5 * SEC, 60 * SEC, 10);
        assert_eq!(r.key("h", T0), Lookup::Missing);
        r.set_key("h".into(), None, T0);
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
        r.set_config(config.clone(), T0);
        assert!(matches!(r.config(T0 + SEC), Lookup::Fresh(_)));
        assert!(matches!(r.config(T0 + 6 * SEC), Lookup::Stale(_)));
        assert!(matches!(r.config(T0 + 10 * SEC), Lookup::Old(_)));
    }

    #[test]
    fn one_refresh_of_a_stale_record_at_a_time_until_it_is_lost_or_released() {
        let r = Records::new(5 * SEC, 60 * SEC, 10);
        assert!(!r.claim_key("h", T0), "nothing cached: nothing to refresh");
        r.set_key("h".into(), None, T0);
        assert!(!r.claim_key("h", T0 + SEC), "fresh");
        assert!(r.claim_key("h", T0 + 61 * SEC));
        assert!(!r.claim_key("h", T0 + 62 * SEC), "one at a time");
        r.release_key("h");
        assert!(r.claim_key("h", T0 + 62 * SEC), "released after a failure");
        assert!(r.claim_key("h", T0 + 67 * SEC), "a claim a TTL old is lost");
        r.set_key("h".into(), None, T0 + 68 * SEC);
        assert!(!r.claim_key("h", T0 + 69 * SEC), "refreshed");
        assert!(!r.claim_config(T0));
        let config = Arc::new(
            EdgeConfig::from_json(
                r#"{"policies":[{"name":"p","dimensions":["api_key"],"quota":{"capacity":1,"period":"1s"},"failure_mode":"fail_open"}],"plans":{"free":["p"]}}"#,
            )
            .unwrap(),
        );
        r.set_config(config, T0);
        assert!(!r.claim_config(T0 + SEC));
        assert!(r.claim_config(T0 + 6 * SEC));
        assert!(!r.claim_config(T0 + 7 * SEC));
        r.release_config();
        assert!(r.claim_config(T0 + 7 * SEC));
    }

    #[test]
    fn the_key_cache_is_bounded() {
        let r = Records::new(5 * SEC, 5 * SEC, 3);
        for i in 0..10 {
            r.set_key(format!("k{i}"), None, T0);
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
