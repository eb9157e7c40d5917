//! In-flight slots: a policy with `max_in_flight` admits a request only with one
//! of its slots (`lua/in_flight.lua`), held until the host releases it when the
//! response is over, and expiring on its own if the instance dies. Taken after
//! the bucket check, all or none; a request refused for its slots costs no
//! tokens (the check is refunded).

use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::contract::DENIED_STATUS;
use floodgate_shared::policy::FailureMode;
use floodgate_shared::script::{When, in_flight_key};
use floodgate_shared::stats::PolicyOutcome;
use floodgate_shared::time::{Clock, Micros};

use super::check::Checked;
use super::guarded::Called;
use super::limits::Limits;
use super::{Pipeline, Reply, Slot, Task, boxed};
use crate::stats::Outcome;
use crate::store::{MaybeSend, MaybeSync, Store, StoreError};

/// Unique slot ids: a per-instance random prefix and a counter.
pub struct SlotIds {
    prefix: String,
    next: AtomicU64,
}

impl SlotIds {
    pub fn new(now: Micros) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_i64(now);
        Self {
            prefix: format!("{:016x}", h.finish()),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        format!(
            "{}-{:x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The slots of an admitted request.
pub enum Held {
    /// One per policy with `max_in_flight` (none if no policy has one).
    Slots(Vec<Slot>),
    /// The slots could not be taken (the store failed) and every limited policy
    /// fails open or falls back locally: admitted without a slot, marked.
    Unlimited,
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The request's slots, or its refusal: 429 when a limit is full, 503 when the
    /// store failed and a limited policy fails closed (both refund the check).
    pub(super) async fn slots(
        &self,
        limits: &Limits<'_>,
        checked: &mut Option<Checked>,
        later: &mut Vec<Task>,
    ) -> Result<Held, Reply> {
        if limits.enforced().all(|(_, p)| p.max_in_flight().is_none()) {
            return Ok(Held::Slots(vec![]));
        }
        // boxed: only requests of in-flight limits take slots (a store call each)
        let taken = Box::pin(self.take_slots(limits, later)).await;
        let refund = |later: &mut Vec<Task>, checked: &mut Option<Checked>| {
            if let Some(c) = checked.take() {
                later.push(self.refund(c));
            }
        };
        let latency = checked.as_ref().and_then(|c| c.latency);
        match taken {
            Ok(Some(slots)) => Ok(Held::Slots(slots)),
            Ok(None) => {
                refund(later, checked);
                self.count(limits, Outcome::Throttled, latency);
                self.count_policies(limits, |_, p| {
                    (!p.shadow() && p.max_in_flight().is_some()).then_some(PolicyOutcome::Throttled)
                });
                Err(Reply::json(
                    DENIED_STATUS,
                    "Too many requests in flight",
                    Some("wait for a response before sending more"),
                )
                .with_header("Retry-After", "1"))
            }
            Err(e) => {
                let limited = limits
                    .enforced()
                    .filter(|(_, p)| p.max_in_flight().is_some());
                if FailureMode::strictest(limited.map(|(_, p)| p.failure_mode()))
                    != FailureMode::FailClosed
                {
                    // fail_open and local_fallback: admit without a slot
                    return Ok(Held::Unlimited);
                }
                refund(later, checked);
                Err(self.degraded_refusal(
                    Some(limits),
                    limits.route_name(),
                    &format!("in-flight slots unavailable: {e}"),
                ))
            }
        }
    }

    /// Takes one in-flight slot per policy with `max_in_flight`; all or none.
    /// `Ok(None)`: some limit is full.
    async fn take_slots(
        &self,
        limits: &Limits<'_>,
        later: &mut Vec<Task>,
    ) -> Result<Option<Vec<Slot>>, StoreError> {
        let mut taken = vec![];
        for (key, p) in limits.enforced() {
            let Some(limit) = p.max_in_flight() else {
                continue;
            };
            let slot = Slot {
                key: in_flight_key(key),
                id: self.slot_ids.next(),
            };
            match self.take_slot(&slot, limit, later).await {
                Ok(true) => taken.push(slot),
                Ok(false) => {
                    later.extend(self.release_later(taken));
                    return Ok(None);
                }
                Err(e) => {
                    later.extend(self.release_later(taken));
                    return Err(e);
                }
            }
        }
        Ok(Some(taken))
    }

    /// One slot of a set holding at most `limit`; a take that missed its deadline
    /// is given back if it succeeded after all.
    async fn take_slot(
        &self,
        slot: &Slot,
        limit: u32,
        later: &mut Vec<Task>,
    ) -> Result<bool, StoreError> {
        let ttl_ms = (self.settings.in_flight_ttl / 1_000).max(1) as u64;
        let sent = self.clock.now();
        let deadline = self.global.deadline(sent);
        // a busy store's take is waited for up to the ceiling, as the check is:
        // guarded as long
        let until = match self.until(sent, self.global.ceiling().max(deadline)) {
            When::RedisUntil(t) => Some(t),
            _ => None,
        };
        let store = self.global.store.clone();
        let (k, id) = (slot.key.clone(), slot.id.clone());
        let fut = boxed(async move { store.acquire_slot(&k, &id, limit, ttl_ms, until).await });
        match self.global.call(&self.clock, deadline, fut).await {
            Called::Done(taken) => Ok(taken),
            Called::Failed(e, late) => {
                if let Some(late) = late {
                    // taken after all? give it back
                    let store = self.global.store.clone();
                    let s = slot.clone();
                    later.push(boxed(async move {
                        if let Ok(true) = late.await {
                            let _ = store.release_slot(&s.key, &s.id).await;
                        }
                    }));
                }
                Err(e)
            }
        }
    }

    /// Gives back in-flight slots, as a task for the host to run once the
    /// response is over (errors ignored: an unreleased slot expires); `None` when
    /// there are none.
    pub fn release_later(&self, slots: Vec<Slot>) -> Option<Task> {
        if slots.is_empty() {
            return None;
        }
        let store = self.global.store.clone();
        Some(boxed(async move {
            for s in slots {
                let _ = store.release_slot(&s.key, &s.id).await;
            }
        }))
    }
}
