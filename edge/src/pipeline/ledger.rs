//! The regional ledger at work (`floodgate_shared::ledger`): a bounded request
//! of a key this instance holds nothing of, and has not seen busy, is decided by
//! ONE plain `HINCRBY` at its region's store instead of a pool take (a script
//! of four billed commands, and often a refill of nine); what the region
//! admitted this way is charged to the global buckets in bulk, by one instance
//! per region per [`SETTLE_EVERY`].

use std::sync::atomic::Ordering;

use floodgate_shared::bucket::Decision;
use floodgate_shared::ledger::{
    self, BLOCKED, Field, LEDGER_CHARGE, LEDGER_DONE, LEDGER_KEY, LEDGER_TAKE, LOCK_KEY,
    SETTLE_EVERY, SETTLING_KEY, count_of, in_debt,
};
use floodgate_shared::policy::Policy;
use floodgate_shared::time::{Clock, Micros};

use super::guarded::Guarded;
use super::{Pipeline, Task, boxed};
use crate::store::{MaybeSend, MaybeSync, SetOptions, Store, StoreError, Value};

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The decision of a one-bucket request at its region's ledger: `Some`
    /// admitted (within the region's share), `None` not for the ledger (the key
    /// is busy here, its share spent this interval, or the regional store did
    /// not answer): its pool decides.
    pub(super) async fn ledgered(
        &self,
        region: &Guarded<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        later: &mut Vec<Task>,
    ) -> Option<Vec<Decision>> {
        let [(key, policy)] = buckets else {
            return None;
        };
        let share = ledger::share(policy.max_overshoot()?, regions);
        let now = self.clock.now();
        if share == 0 || !self.leases.ledger_may(key, now) {
            return None;
        }
        let q = policy.quota();
        let field = Field {
            bucket: key.to_string(),
            emission: q.emission_interval(),
            burst: q.burst_window(),
        }
        .encode();
        let cost = i64::from(policy.cost());
        let count = self.incr(region, &field, cost, later).await?;
        if count > share as i64 {
            // over the share (or blocked): taken back, and this key goes to its
            // pool on this instance until the next settlement
            self.leases.ledger_spent(key, now + SETTLE_EVERY);
            later.push(self.take_back(region, field, cost));
            return None;
        }
        self.settle_when_due(region, now, later);
        self.leases.ledger_used(key, now);
        let left = share - count as u64;
        Some(self.leases.pool_decisions(buckets, &[left], now))
    }

    /// `HINCRBY <ledger> <field> <by>` within the regional store's deadline: the
    /// count after it.
    async fn incr(
        &self,
        region: &Guarded<S>,
        field: &str,
        by: i64,
        later: &mut Vec<Task>,
    ) -> Option<i64> {
        let store = region.store.clone();
        let (field, by) = (field.to_string(), by.to_string());
        let fut = boxed(async move {
            let args: [&[u8]; 4] = [
                b"HINCRBY",
                LEDGER_KEY.as_bytes(),
                field.as_bytes(),
                by.as_bytes(),
            ];
            store.command(&args).await?.into_int()
        });
        // a late increment counts a request the pool decides: taken back
        region.call_now(&self.clock, fut).await.or_drain(later)
    }

    /// Takes an increment back (the request went to its pool), in the background.
    fn take_back(&self, region: &Guarded<S>, field: String, cost: i64) -> Task {
        let store = region.store.clone();
        boxed(async move {
            let by = (-cost).to_string();
            let args: [&[u8]; 4] = [
                b"HINCRBY",
                LEDGER_KEY.as_bytes(),
                field.as_bytes(),
                by.as_bytes(),
            ];
            let _ = store.command(&args).await;
        })
    }

    /// Once per [`SETTLE_EVERY`] on this instance: tries to become the region's
    /// settler for this interval and, if it does, charges its ledger.
    fn settle_when_due(&self, region: &Guarded<S>, now: Micros, later: &mut Vec<Task>) {
        let due = self.ledger_settle_at.load(Ordering::Relaxed);
        if now < due
            || self
                .ledger_settle_at
                .compare_exchange(due, now + SETTLE_EVERY, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let settler = Settler {
            region: region.store.clone(),
            global: self.global.store.clone(),
        };
        later.push(boxed(async move {
            let _ = settler.settle().await;
        }));
    }
}

/// What a settlement needs, owned by its background task.
struct Settler<S> {
    region: S,
    global: S,
}

impl<S: Store> Settler<S> {
    /// Charges the region's ledger to the global store if this instance takes
    /// the interval's lock (`SET NX PX`).
    async fn settle(&self) -> Result<(), StoreError> {
        let ttl = std::time::Duration::from_micros(SETTLE_EVERY as u64);
        let lock = SetOptions {
            condition: Some(crate::store::SetCondition::Missing),
            expire: Some(ttl),
        };
        if !self.region.set(LOCK_KEY, b"1", lock).await? {
            return Ok(());
        }
        let taken = self
            .region
            .run(&LEDGER_TAKE, &[LEDGER_KEY, SETTLING_KEY], &[])
            .await?;
        let counts = parse_ledger(taken)?;
        let blocked = self.charge(&counts).await?;
        let mut args = vec![BLOCKED.to_string()];
        args.extend(blocked);
        self.region
            .run(&LEDGER_DONE, &[LEDGER_KEY, SETTLING_KEY], &args)
            .await?;
        Ok(())
    }

    /// Charges every counted bucket (in one call where the global store takes
    /// any keys together, else one per bucket): the fields whose bucket is in
    /// debt after it, or was blocked and still is.
    async fn charge(&self, counts: &[(String, Field, u64)]) -> Result<Vec<String>, StoreError> {
        let groups: Vec<&[(String, Field, u64)]> = if self.global.one_slot() {
            vec![counts]
        } else {
            counts.chunks(1).collect()
        };
        let mut blocked = vec![];
        for group in groups.into_iter().filter(|g| !g.is_empty()) {
            let keys: Vec<&str> = group.iter().map(|(_, f, _)| f.bucket.as_str()).collect();
            let mut args = vec![String::new()];
            for (_, f, n) in group {
                args.extend([f.emission.to_string(), f.burst.to_string(), n.to_string()]);
            }
            let reply = self.global.run_ints(&LEDGER_CHARGE, &keys, &args).await?;
            let Some((now, full_ats)) = reply.split_first() else {
                return Err(StoreError::protocol("an empty ledger charge reply"));
            };
            for ((raw, f, _), full_at) in group.iter().zip(full_ats) {
                if in_debt(*full_at, *now, f.burst) {
                    blocked.push(raw.clone());
                }
            }
        }
        Ok(blocked)
    }
}

/// `{field, count, ...}` as (raw field, field, count to charge: a blocked
/// bucket's less [`BLOCKED`], blocked again only if the charge finds it still in
/// debt); fields that do not parse are dropped (nothing is charged for them).
fn parse_ledger(v: Value) -> Result<Vec<(String, Field, u64)>, StoreError> {
    let items = v.into_byte_list()?;
    Ok(items
        .chunks(2)
        .filter_map(|pair| {
            let [field, count] = pair else { return None };
            let raw = String::from_utf8(field.clone()).ok()?;
            let f = Field::decode(&raw)?;
            let n: i64 = std::str::from_utf8(count).ok()?.parse().ok()?;
            Some((raw, f, count_of(n).0))
        })
        .collect())
}
