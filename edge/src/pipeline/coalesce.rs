//! Identical concurrent exact checks, decided by ONE store call: a busy key's
//! requests that reach the check while a group is open (the same buckets,
//! quotas and costs) join the first one's group; it sends one call
//! deciding all of them one after another at one instant
//! ([`floodgate_shared::script::merge`]) and hands each its own verdict — what
//! its own call would have answered. Each request then answers as if it had
//! called alone; the store's work, and every rider's deadline, breaker and
//! request path, are one call's (the riders skip it).
//!
//! A group is open from its leader's arrival while turns of the event loop
//! bring riders (the leader yields a few turns at most, `check::GATHER_TURNS`),
//! at most [`MAX_OPEN`] at a time. Only natively: a Worker's requests are
//! separate events, and one request's call cannot carry another's (see
//! `PipelineConfig::coalesce`).

use std::sync::{Arc, Mutex};

use floodgate_shared::policy::FailureMode;
use floodgate_shared::script::Verdict;
use floodgate_shared::script::merge::MAX_MERGED;

use super::limits::OwnedCheck;
use crate::store::StoreError;
use crate::sync::lock;

/// The most groups open at once (a turn with many different keys coalesces
/// nothing and should not pay a long search).
pub const MAX_OPEN: usize = 8;

/// What a rider gets from its group's call.
pub enum Share {
    Verdict(Verdict),
    /// The call failed (refused, late, the breaker open): every rider answers by
    /// the group's failure mode; the leader settles a late reply for them all.
    Failed(StoreError),
}

type Rider = futures_channel::oneshot::Sender<Share>;

struct Open {
    id: u64,
    checks: Arc<Vec<OwnedCheck>>,
    mode: FailureMode,
    riders: Vec<Rider>,
}

/// The open groups.
#[derive(Default)]
pub struct Coalescer {
    open: Mutex<(u64, Vec<Open>)>,
}

/// A request's place in a group.
pub enum Role<'c> {
    /// The first: it calls for the group once it is closed.
    Leader(Ticket<'c>),
    /// Another: its verdict (or the group's failure) comes from the leader;
    /// `Err`: the leader went away before calling, decide alone. With the
    /// group's checks (its own).
    Rider(
        futures_channel::oneshot::Receiver<Share>,
        Arc<Vec<OwnedCheck>>,
    ),
    /// No group (too many open): decide alone.
    Alone,
}

/// The leader's hold on its group: [`Ticket::close`] takes the riders; dropped
/// before that (the leader cancelled), the riders decide alone.
pub struct Ticket<'c> {
    coalescer: &'c Coalescer,
    id: u64,
    /// What the group decides.
    pub checks: Arc<Vec<OwnedCheck>>,
}

impl Coalescer {
    /// Joins the open group deciding checks that `same` recognises as the
    /// request's (with failure mode `mode`), or opens one deciding `checks`.
    pub fn join(
        &self,
        same: impl Fn(&[OwnedCheck]) -> bool,
        checks: impl FnOnce() -> Arc<Vec<OwnedCheck>>,
        mode: FailureMode,
    ) -> Role<'_> {
        let mut guard = lock(&self.open);
        let (next, open) = &mut *guard;
        let joinable =
            |g: &&mut Open| g.mode == mode && g.riders.len() + 1 < MAX_MERGED && same(&g.checks);
        if let Some(g) = open.iter_mut().find(joinable) {
            let (tx, rx) = futures_channel::oneshot::channel();
            g.riders.push(tx);
            return Role::Rider(rx, g.checks.clone());
        }
        if open.len() >= MAX_OPEN {
            return Role::Alone;
        }
        *next += 1;
        let checks = checks();
        open.push(Open {
            id: *next,
            checks: checks.clone(),
            mode,
            riders: vec![],
        });
        Role::Leader(Ticket {
            coalescer: self,
            id: *next,
            checks,
        })
    }

    fn take(&self, id: u64) -> Vec<Rider> {
        let mut guard = lock(&self.open);
        let open = &mut guard.1;
        match open.iter().position(|g| g.id == id) {
            Some(i) => open.swap_remove(i).riders,
            None => vec![],
        }
    }
}

impl Ticket<'_> {
    /// How many have joined so far.
    pub fn riders(&self) -> usize {
        let guard = lock(&self.coalescer.open);
        guard
            .1
            .iter()
            .find(|g| g.id == self.id)
            .map_or(0, |g| g.riders.len())
    }

    /// Closes the group: its riders, in the order they joined.
    pub fn close(self) -> Vec<Rider> {
        let riders = self.coalescer.take(self.id);
        std::mem::forget(self);
        riders
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // the riders' receivers see their senders dropped: they decide alone
        drop(self.coalescer.take(self.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate_shared::policy::Quota;

    fn checks(key: &str) -> Arc<Vec<OwnedCheck>> {
        let quota = Quota::new(10, 10, 60_000_000).unwrap();
        Arc::new(vec![OwnedCheck::new(key, quota, 1, false)])
    }

    /// Joins with `checks` (compared, and made when opening).
    fn join<'c>(c: &'c Coalescer, checks: &Arc<Vec<OwnedCheck>>, mode: FailureMode) -> Role<'c> {
        c.join(|g| g == checks.as_slice(), || checks.clone(), mode)
    }

    #[test]
    fn identical_checks_ride_with_the_first_and_others_lead_their_own() {
        let c = Coalescer::default();
        let a = checks("rl:a");
        let Role::Leader(leader) = join(&c, &a, FailureMode::FailClosed) else {
            panic!("the first leads");
        };
        let Role::Rider(mut r1, _) = join(&c, &checks("rl:a"), FailureMode::FailClosed) else {
            panic!("the same checks ride");
        };
        assert!(
            matches!(join(&c, &a, FailureMode::FailOpen), Role::Leader(_)),
            "another failure mode: its own group"
        );
        assert!(matches!(
            join(&c, &checks("rl:b"), FailureMode::FailClosed),
            Role::Leader(_)
        ));
        let riders = leader.close();
        assert_eq!(riders.len(), 1);
        assert!(
            matches!(join(&c, &a, FailureMode::FailClosed), Role::Leader(_)),
            "a closed group takes no one"
        );
        assert!(r1.try_recv().unwrap().is_none(), "nothing sent yet");
    }

    #[test]
    fn a_leader_that_goes_away_leaves_its_riders_to_decide_alone() {
        let c = Coalescer::default();
        let a = checks("rl:a");
        let leader = join(&c, &a, FailureMode::FailClosed);
        let Role::Rider(mut rider, _) = join(&c, &a, FailureMode::FailClosed) else {
            panic!("rides");
        };
        drop(leader);
        assert!(rider.try_recv().is_err(), "canceled");
        assert!(matches!(
            join(&c, &a, FailureMode::FailClosed),
            Role::Leader(_)
        ));
    }

    #[test]
    fn at_most_a_few_groups_are_open() {
        let c = Coalescer::default();
        let held: Vec<_> = (0..MAX_OPEN)
            .map(|i| join(&c, &checks(&format!("rl:{i}")), FailureMode::FailClosed))
            .collect();
        assert!(held.iter().all(|r| matches!(r, Role::Leader(_))));
        assert!(matches!(
            join(&c, &checks("rl:x"), FailureMode::FailClosed),
            Role::Alone
        ));
        assert!(
            matches!(
                join(&c, &checks("rl:0"), FailureMode::FailClosed),
                Role::Rider(..)
            ),
            "an open group still takes riders"
        );
    }
}
