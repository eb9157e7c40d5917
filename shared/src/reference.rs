//! The reference: what Floodgate promises an API operator and its clients,
//! written to be read — small, pure, and obviously right — with nothing of how
//! the product keeps those promises (no leases, caches, revisions, scripts or
//! breakers). The stateful tests (`tests/tests/stateful.rs`) run random
//! sequences of requests, operator changes, waits, store stalls and restarts and
//! instance replacements against it and against real edges of both hosts, and
//! check every answer against what it allows.
//!
//! The promises:
//! - **Quotas.** A request is admitted only while every policy of its key's plan
//!   (and of its route) has room: an `exact` policy never admits past its
//!   capacity; a `bounded` one never past capacity + bound, and never refuses
//!   while capacity − bound has room. (Quotas here refill too slowly to matter
//!   while a test runs: a capacity is a count.)
//! - **A refusal costs nothing**: no token of any policy, no credit.
//! - **Credits** admit exactly as many requests as they hold, across every
//!   change of their key (identity included), and a key out of them is refused.
//! - **Keys**: an unknown or revoked key gets 401, a denied one 403.
//! - **Changes**: an operator's change is in force on every instance within the
//!   propagation bound; until then, the old terms or the new may answer.
//! - **Outages**: while the store cannot answer, a `fail_closed` request gets
//!   503 and spends nothing.
//!
//! Where the real edges may answer either of two ways (terms in flux, a bound's
//! slack), the model keeps what was spent as a span `[lo, hi]` instead of a
//! number: an admission the terms may or may not have charged raises `hi` only.

use std::collections::{BTreeMap, BTreeSet};

use crate::time::Micros;

/// How a policy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Per {
    /// One bucket per API key.
    Key,
    /// One bucket per identity (a key without one counts alone).
    Identity,
}

/// A policy as the operator configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefPolicy {
    pub per: Per,
    pub capacity: u64,
    /// `Some(bound)`: bounded consistency with that `max_overshoot`.
    pub bound: Option<u64>,
}

/// A key's record as the operator left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefKey {
    pub plan: String,
    pub identity: Option<String>,
    pub revoked: bool,
    /// Whether the key has credits (their count is state: [`Model::credits`]).
    pub credited: bool,
}

/// Everything an operator sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Terms {
    pub policies: BTreeMap<String, RefPolicy>,
    pub plans: BTreeMap<String, Vec<String>>,
    /// Exact paths with their own policies (on top of the plan's).
    pub routes: BTreeMap<String, Vec<String>>,
    /// Key ids refused with 403.
    pub denied: BTreeSet<String>,
    /// Key records by key id.
    pub keys: BTreeMap<String, RefKey>,
}

/// What a client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Admitted,
    /// 429 for a policy.
    Throttled,
    /// 429 for the key's credits.
    UsageLimited,
    Unauthorized,
    Forbidden,
    /// 503: the store could not decide.
    Unavailable,
}

/// What has been spent, or is left, as far as the model can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub lo: u64,
    pub hi: u64,
}

impl Span {
    pub fn exactly(n: u64) -> Self {
        Span { lo: n, hi: n }
    }
}

/// A bucket: its policy and whose it is (`k:<id>`, `i:<identity>`,
/// `i:<identity>:k:<id>`: an identity's key has buckets of its own).
pub type Bucket = (String, String);

/// The reference state: the terms in force, older ones still in force until
/// their instant, and what was spent.
#[derive(Debug, Clone)]
pub struct Model {
    terms: Terms,
    older: Vec<(Micros, Terms)>,
    /// Requests admitted per bucket.
    spent: BTreeMap<Bucket, Span>,
    /// Credits left per key id.
    credits: BTreeMap<String, Span>,
    /// Until then the store may be unable to answer.
    unavailable_until: Micros,
}

/// What the terms `t` make of one request of `key` to `path` (the buckets it
/// is charged to, with their policies, and the answer if it is refused before
/// any bucket).
enum Verdict<'t> {
    Refused(Outcome),
    Charged {
        buckets: Vec<(Bucket, &'t RefPolicy)>,
        credited: bool,
    },
}

fn verdict<'t>(t: &'t Terms, key: &str, path: &str) -> Verdict<'t> {
    let Some(k) = t.keys.get(key) else {
        return Verdict::Refused(Outcome::Unauthorized);
    };
    if k.revoked {
        return Verdict::Refused(Outcome::Unauthorized);
    }
    if t.denied.contains(key) {
        return Verdict::Refused(Outcome::Forbidden);
    }
    let plan = t.plans.get(&k.plan).into_iter().flatten();
    let route = t.routes.get(path).into_iter().flatten();
    let buckets = plan
        .chain(route)
        .filter_map(|name| t.policies.get(name).map(|p| (name, p)))
        .map(|(name, p)| {
            let whose = match (p.per, &k.identity) {
                (Per::Key, None) | (Per::Identity, None) => format!("k:{key}"),
                (Per::Key, Some(i)) => format!("i:{i}:k:{key}"),
                (Per::Identity, Some(i)) => format!("i:{i}"),
            };
            ((name.clone(), whose), p)
        })
        .collect();
    Verdict::Charged {
        buckets,
        credited: k.credited,
    }
}

impl Model {
    pub fn new(terms: Terms, credits: BTreeMap<String, u64>) -> Self {
        Model {
            terms,
            older: vec![],
            spent: BTreeMap::new(),
            credits: credits
                .into_iter()
                .map(|(k, n)| (k, Span::exactly(n)))
                .collect(),
            unavailable_until: 0,
        }
    }

    /// The terms in force now.
    pub fn terms(&self) -> &Terms {
        &self.terms
    }

    /// The requests admitted in `bucket` so far, as far as known.
    pub fn spent(&self, bucket: &Bucket) -> Span {
        self.spent.get(bucket).copied().unwrap_or_default()
    }

    /// The credits `key` has left, as far as known.
    pub fn credits(&self, key: &str) -> Option<Span> {
        self.credits.get(key).copied()
    }

    /// The operator changes the terms at `now` (`edit`); the old ones may still
    /// answer until `now + bound`.
    pub fn change(&mut self, now: Micros, bound: Micros, edit: impl FnOnce(&mut Terms)) {
        let old = self.terms.clone();
        edit(&mut self.terms);
        self.older.push((now + bound, old));
    }

    /// The operator sets `key`'s credits to `count` (`None`: none): the count
    /// holds from now on, on every instance (the store holds it).
    pub fn set_credits(&mut self, now: Micros, bound: Micros, key: &str, count: Option<u64>) {
        self.change(now, bound, |t| {
            if let Some(k) = t.keys.get_mut(key) {
                k.credited = count.is_some();
            }
        });
        match count {
            Some(n) => self.credits.insert(key.to_string(), Span::exactly(n)),
            None => self.credits.remove(key),
        };
    }

    /// The store may be unable to answer until `until`.
    pub fn unavailable(&mut self, until: Micros) {
        self.unavailable_until = self.unavailable_until.max(until);
    }

    /// Every terms in force at `now`: the current ones and those not past their
    /// instant.
    fn in_force(&self, now: Micros) -> impl Iterator<Item = &Terms> {
        std::iter::once(&self.terms).chain(
            self.older
                .iter()
                .filter(move |(until, _)| *until > now)
                .map(|(_, t)| t),
        )
    }

    /// The answers the terms `t` allow for a request of `key` to `path`.
    fn allowed_by(&self, t: &Terms, key: &str, path: &str) -> BTreeSet<Outcome> {
        let mut out = BTreeSet::new();
        let (buckets, credited) = match verdict(t, key, path) {
            Verdict::Refused(o) => {
                out.insert(o);
                return out;
            }
            Verdict::Charged { buckets, credited } => (buckets, credited),
        };
        // each bucket: may it admit, may it refuse?
        let (mut may_admit, mut may_throttle) = (true, false);
        for (b, p) in &buckets {
            let s = self.spent(b);
            let (admit_limit, refuse_limit) = match p.bound {
                None => (p.capacity, p.capacity),
                Some(bound) => (p.capacity + bound, p.capacity.saturating_sub(bound)),
            };
            may_admit &= s.lo < admit_limit;
            may_throttle |= s.hi >= refuse_limit;
        }
        if may_throttle {
            out.insert(Outcome::Throttled);
        }
        if may_admit {
            match self.credits.get(key).filter(|_| credited) {
                Some(c) => {
                    if c.hi > 0 {
                        out.insert(Outcome::Admitted);
                    }
                    if c.lo == 0 {
                        out.insert(Outcome::UsageLimited);
                    }
                }
                None => {
                    out.insert(Outcome::Admitted);
                }
            }
        }
        out
    }

    /// The answers allowed at `now` for a request of `key` to `path`.
    pub fn allowed(&self, now: Micros, key: &str, path: &str) -> BTreeSet<Outcome> {
        let mut out: BTreeSet<Outcome> = self
            .in_force(now)
            .flat_map(|t| self.allowed_by(t, key, path))
            .collect();
        if now < self.unavailable_until {
            out.insert(Outcome::Unavailable);
        }
        out
    }

    /// A request of `key` to `path` sent at `now` got `outcome`: checked against
    /// what is allowed (`Err` names the broken promise), then counted.
    pub fn observe(
        &mut self,
        now: Micros,
        key: &str,
        path: &str,
        outcome: Outcome,
    ) -> Result<(), String> {
        let allowed = self.allowed(now, key, path);
        if !allowed.contains(&outcome) {
            return Err(format!(
                "{key} {path}: answered {outcome:?}, allowed {allowed:?} (spent {:?}, credits {:?})",
                self.spent_of(now, key, path),
                self.credits.get(key)
            ));
        }
        if outcome != Outcome::Admitted {
            // a refusal costs nothing
            return Ok(());
        }
        // the terms that could have admitted it: each may have charged it
        let charging: Vec<(Vec<Bucket>, bool)> = self
            .in_force(now)
            .filter(|t| self.allowed_by(t, key, path).contains(&Outcome::Admitted))
            .filter_map(|t| match verdict(t, key, path) {
                Verdict::Charged { buckets, credited } => {
                    Some((buckets.into_iter().map(|(b, _)| b).collect(), credited))
                }
                Verdict::Refused(_) => None,
            })
            .collect();
        let every = |b: &Bucket| charging.iter().all(|(bs, _)| bs.contains(b));
        let touched: BTreeSet<Bucket> = charging.iter().flat_map(|(bs, _)| bs.clone()).collect();
        for b in touched {
            let sure = every(&b);
            let s = self.spent.entry(b).or_default();
            s.hi += 1;
            if sure {
                s.lo += 1;
            }
        }
        let credited_in = charging.iter().filter(|(_, c)| *c).count();
        if let Some(c) = self.credits.get_mut(key).filter(|_| credited_in > 0) {
            c.lo = c.lo.saturating_sub(1);
            if credited_in == charging.len() {
                c.hi = c.hi.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// What the buckets of a request were known to have spent (for messages).
    fn spent_of(&self, now: Micros, key: &str, path: &str) -> Vec<(Bucket, Span)> {
        let mut out = vec![];
        for t in self.in_force(now) {
            if let Verdict::Charged { buckets, .. } = verdict(t, key, path) {
                out.extend(buckets.into_iter().map(|(b, _)| {
                    let s = self.spent(&b);
                    (b, s)
                }));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(capacity: u64, bound: Option<u64>) -> Terms {
        let mut t = Terms::default();
        t.policies.insert(
            "base".into(),
            RefPolicy {
                per: Per::Key,
                capacity,
                bound,
            },
        );
        t.policies.insert(
            "team".into(),
            RefPolicy {
                per: Per::Identity,
                capacity: 4,
                bound: None,
            },
        );
        t.plans.insert("std".into(), vec!["base".into()]);
        t.plans.insert("team".into(), vec!["team".into()]);
        t.plans.insert("bare".into(), vec![]);
        for (id, plan, identity) in [("a", "std", None), ("b", "team", Some("acme"))] {
            t.keys.insert(
                id.into(),
                RefKey {
                    plan: plan.into(),
                    identity: identity.map(str::to_string),
                    revoked: false,
                    credited: false,
                },
            );
        }
        t
    }

    fn only(o: Outcome) -> BTreeSet<Outcome> {
        BTreeSet::from([o])
    }

    #[test]
    fn an_exact_quota_admits_exactly_its_capacity_and_a_refusal_costs_nothing() {
        let mut m = Model::new(terms(3, None), BTreeMap::new());
        for _ in 0..3 {
            assert_eq!(m.allowed(0, "a", "/x"), only(Outcome::Admitted));
            m.observe(0, "a", "/x", Outcome::Admitted).unwrap();
        }
        for _ in 0..3 {
            assert_eq!(m.allowed(0, "a", "/x"), only(Outcome::Throttled));
            m.observe(0, "a", "/x", Outcome::Throttled).unwrap();
        }
        assert_eq!(m.spent(&("base".into(), "k:a".into())), Span::exactly(3));
        assert!(m.observe(0, "a", "/x", Outcome::Admitted).is_err());
        assert!(
            m.observe(0, "zz", "/x", Outcome::Admitted).is_err(),
            "unknown key"
        );
    }

    #[test]
    fn a_bounded_quota_may_admit_up_to_its_bound_and_must_admit_below_capacity_less_it() {
        let mut m = Model::new(terms(10, Some(2)), BTreeMap::new());
        for i in 0..12 {
            let allowed = m.allowed(0, "a", "/x");
            assert!(allowed.contains(&Outcome::Admitted), "{i}");
            assert_eq!(allowed.contains(&Outcome::Throttled), i >= 8, "{i}");
            m.observe(0, "a", "/x", Outcome::Admitted).unwrap();
        }
        assert_eq!(m.allowed(0, "a", "/x"), only(Outcome::Throttled));
    }

    #[test]
    fn a_change_may_answer_either_way_until_its_bound_then_only_the_new_way() {
        let mut m = Model::new(terms(1, None), BTreeMap::new());
        m.observe(0, "a", "/x", Outcome::Admitted).unwrap();
        m.change(10, 100, |t| {
            t.policies.get_mut("base").unwrap().capacity = 5
        });
        let both = BTreeSet::from([Outcome::Admitted, Outcome::Throttled]);
        assert_eq!(m.allowed(50, "a", "/x"), both);
        // admitted while in flux: charged (only one bucket either way)
        m.observe(50, "a", "/x", Outcome::Admitted).unwrap();
        assert_eq!(m.allowed(110, "a", "/x"), only(Outcome::Admitted));
        m.change(200, 100, |t| t.keys.get_mut("a").unwrap().revoked = true);
        assert!(m.allowed(250, "a", "/x").contains(&Outcome::Admitted));
        assert_eq!(m.allowed(300, "a", "/x"), only(Outcome::Unauthorized));
    }

    #[test]
    fn credits_are_conserved_across_an_identity_change_which_starts_key_buckets_afresh() {
        let mut t = terms(100, None);
        t.keys.get_mut("a").unwrap().credited = true;
        let mut m = Model::new(t, BTreeMap::from([("a".to_string(), 3)]));
        for _ in 0..2 {
            m.observe(0, "a", "/x", Outcome::Admitted).unwrap();
        }
        m.change(10, 100, |t| {
            t.keys.get_mut("a").unwrap().identity = Some("globex".into())
        });
        // in flux: either bucket, but one credit left whichever
        m.observe(20, "a", "/x", Outcome::Admitted).unwrap();
        assert_eq!(m.credits("a"), Some(Span::exactly(0)));
        assert_eq!(m.allowed(200, "a", "/x"), only(Outcome::UsageLimited));
        let old = m.spent(&("base".into(), "k:a".into()));
        let new = m.spent(&("base".into(), "i:globex:k:a".into()));
        assert_eq!((old, new), (Span { lo: 2, hi: 3 }, Span { lo: 0, hi: 1 }));
    }

    #[test]
    fn keys_of_one_identity_share_its_bucket_and_outages_allow_503() {
        let mut t = terms(100, None);
        t.keys.insert(
            "c".into(),
            RefKey {
                plan: "team".into(),
                identity: Some("acme".into()),
                revoked: false,
                credited: false,
            },
        );
        let mut m = Model::new(t, BTreeMap::new());
        for key in ["b", "c", "b", "c"] {
            m.observe(0, key, "/x", Outcome::Admitted).unwrap();
        }
        assert_eq!(m.allowed(0, "c", "/x"), only(Outcome::Throttled));
        m.unavailable(50);
        assert!(m.allowed(10, "a", "/x").contains(&Outcome::Unavailable));
        m.observe(10, "a", "/x", Outcome::Unavailable).unwrap();
        assert_eq!(m.allowed(60, "a", "/x"), only(Outcome::Admitted));
    }
}
