//! An exact key this instance has not read yet, decided in ONE global call that
//! reads its record with its buckets (issue 38: at fan-out, where an instance
//! has seldom seen a key, exact mode paid a record read per key and instance on
//! top of the check's four commands: 4.5 billed per request at 48 instances).
//!
//! The call is built on a guess: the plan of the last records this instance
//! read, when they all had it and none had an identity or credits
//! ([`super::records::GUESS_AFTER`]). The record comes back with the verdict
//! (`lua/token_bucket.lua`'s KEYS[n+2]) and is cached as a read would have
//! cached it. When it does not admit the request as guessed — another plan, an
//! identity or credits, revoked, expired or rotated out — whatever the call
//! consumed is given back and the request is decided the usual way on the
//! record just read (or refused by it). A key that does not exist mints
//! nothing: the script writes nothing without its record. A call that fails
//! is what a failed record read is: the caller cannot be verified.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use floodgate_shared::apikeys::{KeyRecord, hash_secret, record_key, secret_id};
use floodgate_shared::changes::{REV_KEY, Revision};
use floodgate_shared::config::EdgeConfig;
use floodgate_shared::policy::{Consistency, Policy};
use floodgate_shared::script::{Call, CallReply, Credited};
use floodgate_shared::time::{Clock, MICROS_PER_SEC, Micros};

use super::caller::load_key;
use super::check::Checked;
use super::guarded::Called;
use super::limits::{Limits, OwnedCheck, as_checks};
use super::records::Lookup;
use super::{Admit, Pipeline, Reply, RequestHead, Task, boxed};
use crate::store::{MaybeSend, MaybeSync, Store, StoreError, StoreErrorKind};

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The answer to a request of a key this instance never read, decided with
    /// its record in one call; `None`: not for this path (the key is cached, no
    /// guess holds, a policy is not an exact token bucket, the store has
    /// several slots, or the record read does not admit the request as
    /// guessed): the usual way decides.
    pub(super) async fn unseen(
        &self,
        secret: &str,
        req: &RequestHead<'_>,
        later: &mut Vec<Task>,
    ) -> Option<Result<Admit, Reply>> {
        let now = self.clock.now();
        let hash = hash_secret(secret);
        if !self.global.store.one_slot() || self.records.key(&hash, now) != Lookup::Missing {
            return None;
        }
        let (Lookup::Fresh(config) | Lookup::Stale(config)) = self.records.config(now) else {
            return None;
        };
        let guessed = Arc::new(KeyRecord::new(
            secret_id(secret)?,
            "",
            &self.records.guess()?,
            0,
        ));
        if let Err(refused) = self.unknown_key_room(req, Some(&config), now) {
            return Some(Err(refused));
        }
        let limits = self.guessed_limits(&config, guessed, req, now)?;
        self.totals.key_cache_misses.fetch_add(1, Ordering::Relaxed);
        let owned = Arc::new(limits.checks());
        let sent = self.clock.now();
        let (verdict, raw) = match self.check_reading(&owned, &hash, later).await {
            Ok(CallReply::Done { each, record }) => (each.into_iter().next()?.verdict, record),
            Ok(CallReply::NoRecord) => {
                let at = self.clock.now();
                load_key(&self.records, &self.totals, hash, None, (at, None));
                self.unknown_keys.charge(req.client_ip, at);
                return Some(Err(Reply::json(401, "Invalid API key", None)));
            }
            // a store that cannot read a record with a check (a script error,
            // nothing decided): the usual way
            Err(None) => return None,
            Err(Some(e)) => return Some(self.unverified(Some(&config), req, &e)),
        };
        let at = self.clock.now();
        let seen = match verdict.revision {
            Revision::Seen(rev) => rev,
            Revision::NotAsked => None,
        };
        let record = load_key(&self.records, &self.totals, hash.clone(), raw, (at, seen));
        let real = record
            .filter(|r| {
                r.credits.is_none() && r.refusal(&hash, at.div_euclid(MICROS_PER_SEC)).is_none()
            })
            .and_then(|r| self.limits(&config, r, req, now).ok())
            .filter(|real| {
                real.checks_are(&owned) && self.blocked(&config, &real.record, req).is_ok()
            });
        let Some(real) = real else {
            // not as guessed: given back, and decided the usual way on the record
            if verdict.admitted {
                later.push(self.refund(Checked {
                    verdict,
                    credits: None,
                    latency: None,
                    owned,
                    credit: None,
                }));
            }
            return None;
        };
        let credited = Credited {
            verdict,
            credits: None,
        };
        let checked = self.checked(&real, credited, sent, owned, None, later);
        Some(self.settle(&real, checked, later).await)
    }

    /// The limits of `guessed`, when this path can decide them: not blocked,
    /// every policy an exact token bucket, no 429 remembered.
    fn guessed_limits<'c>(
        &self,
        config: &'c EdgeConfig,
        guessed: Arc<KeyRecord>,
        req: &RequestHead<'_>,
        now: Micros,
    ) -> Option<Limits<'c>> {
        self.blocked(config, &guessed, req).ok()?;
        let limits = self.limits(config, guessed, req, now).ok()?;
        let exact = |(_, p): &(String, &Policy)| p.consistency() == Consistency::Exact;
        if limits.policies.is_empty() || !limits.mergeable() || !limits.policies.iter().all(exact) {
            return None;
        }
        self.recently_throttled(&limits).ok()?;
        Some(limits)
    }

    /// The check of `owned` reading the record of `hash`, within the global
    /// store's deadline. `Err(None)`: the store cannot read a record with a
    /// check (nothing decided); `Err(Some(_))`: it did not answer (a late
    /// admission is given back).
    async fn check_reading(
        &self,
        owned: &Arc<Vec<OwnedCheck>>,
        hash: &str,
        later: &mut Vec<Task>,
    ) -> Result<CallReply, Option<StoreError>> {
        let sent = self.clock.now();
        let deadline = self.global.deadline(sent);
        let when = self.until(sent, self.global.ceiling().max(deadline));
        let (store, calls, name) = (self.global.store.clone(), owned.clone(), record_key(hash));
        let fut = boxed(async move {
            let checks = as_checks(&calls);
            let call = Call {
                watch: Some(REV_KEY),
                record: Some(&name),
                ..Call::new(&checks, when)
            };
            store.decide(call).await
        });
        match self.global.call(&self.clock, deadline, fut).await {
            Called::Done(reading) => Ok(reading),
            Called::Failed(e, None) if e.kind == StoreErrorKind::Protocol => Err(None),
            Called::Failed(e, late) => {
                self.leases.global_answered(false);
                if let Some(late) = late {
                    later.push(self.refund_late(admitted_late(late), owned.clone(), None));
                }
                Err(Some(e))
            }
        }
    }
}

/// A late record-reading call as the check it is, for its refund.
fn admitted_late(
    late: super::BoxFuture<'static, Result<CallReply, StoreError>>,
) -> super::BoxFuture<'static, Result<Credited, StoreError>> {
    boxed(async move {
        late.await?
            .one()
            .ok_or_else(|| StoreError::protocol("no record: nothing decided"))
    })
}
