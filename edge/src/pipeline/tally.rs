//! The regional tally at work (`floodgate_shared::tally`): a bounded request whose
//! tokens this instance has not drawn already is decided by ONE `HINCRBY` per
//! bucket at its region's store (the buckets of one request in one pipeline), and
//! what the region admitted is charged to the global buckets behind, by one
//! instance per region per epoch; a hot key's slot is topped up with a chunk
//! leased from the global bucket.

use std::sync::atomic::Ordering;

use floodgate_shared::bucket::Decision;
use floodgate_shared::lease::LeaseConfig;
use floodgate_shared::policy::Policy;
use floodgate_shared::tally::{
    self, Ask, CARRY_KEY, CARRY_SWEEP_EPOCHS, CHUNK_MARGIN, Counted, Field, LOCK_KEY, SETTLE_AFTER,
    SETTLING_KEY, TALLY_ADD, TALLY_CHARGE, TALLY_DONE, TALLY_TAKE, Taken, TallySettings, in_debt,
    slot_key,
};
use floodgate_shared::time::{Clock, Micros};

use super::guarded::Guarded;
use super::leases::shares;
use super::{Pipeline, Task, boxed};
use crate::store::{MaybeSend, MaybeSync, SetCondition, SetOptions, Store, StoreError, words};

/// The field a bucket of `policy` is counted under, with `regions` regions.
fn field(key: &str, policy: &Policy, regions: u32) -> String {
    let q = policy.quota();
    Field {
        bucket: key.to_string(),
        emission: q.emission_interval(),
        burst: q.burst_window(),
        carry: shares(policy, regions).carry,
    }
    .encode()
}

fn incr(slot: &str, field: &str, by: i64) -> Vec<Vec<u8>> {
    words(&["HINCRBY", slot, field, &by.to_string()])
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The decisions of a request at its region's tally, `None` when the exact
    /// path decides: a bucket past the region's credit and chunks (or blocked,
    /// or found so lately), or the regional store did not answer in time. What
    /// was counted for a request the exact path decides is taken back.
    pub(super) async fn tallied(
        &self,
        region: &Guarded<S>,
        buckets: &[(&str, &Policy)],
        regions: u32,
        later: &mut Vec<Task>,
    ) -> Option<Vec<Decision>> {
        let now = self.clock.now();
        let asks = self.leases.tally_asks(buckets, regions, now)?;
        let fields: Vec<String> = buckets.iter().map(|(k, p)| field(k, p, regions)).collect();
        let counted: Vec<Vec<Vec<u8>>> = asks
            .iter()
            .zip(&fields)
            .map(|(a, f)| incr(&slot_key(a.epoch), f, a.by()))
            .collect();
        let store = region.store.clone();
        let fut = boxed(async move {
            let replies = store.pipeline(&counted).await?;
            replies
                .into_iter()
                .map(|v| v.ok()?.into_int())
                .collect::<Result<Vec<i64>, StoreError>>()
        });
        // a late increment counts a request the exact path decides: a shortfall
        let afters = region.call_now(&self.clock, fut).await.or_drain(later)?;
        self.settle_when_due(region, now, later);
        // a bucket hot here leases: it needs no chunk
        let hot = self.leases.hot(buckets);
        let mut admitted = true;
        let mut give_back = vec![];
        for (i, ((k, p), (ask, after))) in buckets.iter().zip(asks.iter().zip(&afters)).enumerate()
        {
            let counted = (*ask, *after, fields[i].as_str());
            let (c, top_up) = self.leases.tally_counted(k, p, regions, counted, now);
            if let Some(why) = top_up.filter(|_| !hot.iter().any(|(h, _)| h == k)) {
                super::leasing::count_refill(&self.stats, &self.leases, now, k, p);
                let epoch = self.leases.settings().tally.top_up_epoch(now, why);
                later.push(self.top_up(region, k, p, regions, epoch));
            }
            match c {
                Counted::Admitted => {}
                Counted::WithoutDraw => give_back.push((i, ask.draw as i64)),
                Counted::Over | Counted::Blocked => admitted = false,
            }
        }
        if !admitted {
            // nothing of it stays counted; what was drawn with it goes back too
            give_back = (0..buckets.len()).map(|i| (i, asks[i].by())).collect();
            for (k, _) in buckets {
                self.leases.tally_undrawn(k, now);
            }
        }
        later.extend(self.take_back(region, &asks, &fields, give_back));
        if !admitted {
            return None;
        }
        let left: Vec<u64> = buckets
            .iter()
            .zip(&afters)
            .map(|((_, p), after)| (shares(p, regions).credit as i64 - after).max(0) as u64)
            .collect();
        Some(self.leases.tally_decisions(buckets, &left, now))
    }

    /// A stopping instance's unspent draws taken off the counts they were
    /// counted in (one pipeline): they are not charged as if spent.
    pub(super) fn give_draws_back(&self, draws: Vec<(String, i64, u64)>) -> Option<Task> {
        let region = self.regional.as_ref()?;
        let commands: Vec<Vec<Vec<u8>>> = draws
            .iter()
            .map(|(f, e, n)| incr(&slot_key(*e), f, -(*n as i64)))
            .collect();
        if commands.is_empty() {
            return None;
        }
        let store = region.store.clone();
        Some(boxed(async move {
            let _ = store.pipeline(&commands).await;
        }))
    }

    /// `HINCRBY -n` of what a request's increments should not have counted, in
    /// the background (one pipeline).
    fn take_back(
        &self,
        region: &Guarded<S>,
        asks: &[Ask],
        fields: &[String],
        back: Vec<(usize, i64)>,
    ) -> Option<Task> {
        let commands: Vec<Vec<Vec<u8>>> = back
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(i, n)| incr(&slot_key(asks[i].epoch), &fields[i], -n))
            .collect();
        if commands.is_empty() {
            return None;
        }
        let store = region.store.clone();
        Some(boxed(async move {
            let _ = store.pipeline(&commands).await;
        }))
    }

    /// Tops `key`'s slot of `epoch` up with a chunk leased from its global
    /// bucket, in the background: ONE lease take of cost 0 (granted only while
    /// the bucket has room and the book has free tokens), living until the
    /// epoch ends, then ONE `lua/tally_add.lua` at the region, which adds
    /// nothing once the lease has expired.
    fn top_up(
        &self,
        region: &Guarded<S>,
        key: &str,
        policy: &Policy,
        regions: u32,
        epoch: i64,
    ) -> Task {
        let (global, regional) = (self.global.store.clone(), region.store.clone());
        let leases = self.leases.clone();
        let settings = self.leases.settings().tally;
        let shares = shares(policy, regions);
        let (key, field, q) = (
            key.to_string(),
            field(key, policy, regions),
            *policy.quota(),
        );
        let sent = self.clock.now();
        let life = settings.end_of(epoch) + CHUNK_MARGIN - sent;
        let id = self.leases.id();
        boxed(async move {
            if life <= 0 || shares.book == 0 {
                return;
            }
            let cfg = LeaseConfig {
                max_overshoot: shares.book,
                max_lease: shares.chunk,
                lifetime: life,
                ..LeaseConfig::default()
            };
            let args = cfg.take_args(
                None,
                q.burst_window(),
                q.emission_interval(),
                0,
                shares.chunk,
                &id,
                None,
            );
            let Ok(taken) = global.take_lease(&key, &args).await else {
                leases.global_answered(false);
                return;
            };
            leases.global_answered(true);
            let full_at = sent + (taken.full_at - taken.now).max(0);
            leases.observe_full_at(&key, full_at, Some(taken.outstanding), sent);
            if taken.leased == 0 {
                return;
            }
            let args = [
                format!("<{}", taken.expires_at),
                field,
                taken.leased.to_string(),
            ];
            let slot = slot_key(epoch);
            if let Ok(v) = regional.run(&TALLY_ADD, &[&slot], &args).await
                && v.into_int().is_ok()
            {
                leases.tally_topped_up(&key, sent);
            }
        })
    }

    /// Once per epoch on about half the instances of a region (each tries
    /// every other epoch), at least [`SETTLE_AFTER`] into it: tries to become
    /// the region's settler and, if it does, settles the epoch before the last.
    fn settle_when_due(&self, region: &Guarded<S>, now: Micros, later: &mut Vec<Task>) {
        let settings = self.leases.settings().tally;
        let epoch = settings.epoch_of(now);
        let tried = self.tally_settle_tried.load(Ordering::Relaxed);
        if tried >= epoch
            || now < settings.end_of(epoch - 1) + SETTLE_AFTER
            || self
                .tally_settle_tried
                .compare_exchange(tried, epoch, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            || !self.leases.coin(epoch)
        {
            return;
        }
        let settler = Settler {
            region: region.store.clone(),
            global: self.global.store.clone(),
            settings,
        };
        later.push(boxed(async move {
            let _ = settler.settle(epoch).await;
        }));
    }
}

/// What a settlement needs, owned by its background task.
struct Settler<S> {
    region: S,
    global: S,
    settings: TallySettings,
}

impl<S: Store> Settler<S> {
    /// Settles the epoch before the last if this instance takes the region's
    /// lock for `epoch` (`SET NX PX`, half an epoch).
    async fn settle(&self, epoch: i64) -> Result<(), StoreError> {
        let ttl = std::time::Duration::from_micros((self.settings.epoch / 2).max(1) as u64);
        let lock = SetOptions {
            condition: Some(SetCondition::Missing),
            expire: Some(ttl),
        };
        if !self
            .region
            .set(LOCK_KEY, epoch.to_string().as_bytes(), lock)
            .await?
        {
            return Ok(());
        }
        // (the epoch before this one: its draws of credit live until it ends)
        self.settle_one(epoch - 2, epoch).await?;
        Ok(())
    }

    /// Takes, charges and drops epoch `e`'s slot (`current`: the epoch now);
    /// `false` when what it took was a settlement left pending (the finished
    /// slot waits for the next settlement).
    async fn settle_one(&self, e: i64, current: i64) -> Result<bool, StoreError> {
        let slot = slot_key(e);
        let reply = self
            .region
            .run(&TALLY_TAKE, &[&slot, SETTLING_KEY, CARRY_KEY], &[])
            .await?
            .into_byte_list()?;
        let Some(taken) = Taken::from_reply(&reply).map_err(StoreError::protocol)? else {
            return Ok(true);
        };
        let sweep = e.rem_euclid(CARRY_SWEEP_EPOCHS) == 0;
        let plan = tally::settle(&taken, sweep);
        let blocked = self.charge(&plan.charges).await?;
        let args = tally::done_args(&plan, &blocked, sweep);
        let (a, b) = (slot_key(current), slot_key(current + 1));
        self.region
            .run(&TALLY_DONE, &[SETTLING_KEY, CARRY_KEY, &a, &b], &args)
            .await?;
        Ok(!taken.pending)
    }

    /// Charges every bucket (in one call where the global store takes any keys
    /// together, else one per bucket): the fields whose bucket is in debt after
    /// it.
    async fn charge(&self, charges: &[(tally::Entry, u64)]) -> Result<Vec<String>, StoreError> {
        let groups: Vec<&[(tally::Entry, u64)]> = if self.global.one_slot() {
            vec![charges]
        } else {
            charges.chunks(1).collect()
        };
        let mut blocked = vec![];
        for group in groups.into_iter().filter(|g| !g.is_empty()) {
            let keys: Vec<&str> = group.iter().map(|(e, _)| e.field.bucket.as_str()).collect();
            let mut args = vec![String::new()];
            for (e, n) in group {
                args.extend([
                    e.field.emission.to_string(),
                    e.field.burst.to_string(),
                    n.to_string(),
                ]);
            }
            let reply = self.global.run_ints(&TALLY_CHARGE, &keys, &args).await?;
            let Some((now, full_ats)) = reply.split_first() else {
                return Err(StoreError::protocol("an empty charge reply"));
            };
            for ((e, _), full_at) in group.iter().zip(full_ats) {
                if in_debt(*full_at, *now, e.field.burst) {
                    blocked.push(e.raw.clone());
                }
            }
        }
        Ok(blocked)
    }
}
