//! One edge instance's side of lease mode (`floodgate_shared::lease`): per bucket,
//! decide exactly (one script call per request), or spend a local lease taken
//! from the central bucket, or switch between the two by the key's observed rate.
//!
//! Both modes keep a local deny cache: after a denial the instance answers 429 by
//! itself until the instant Redis said the bucket has room again (as the pipeline
//! does), so a flood against an empty bucket costs no calls in either mode.
//!
//! Tokens out on leases are bounded per bucket by the take script
//! (`LeaseConfig::max_overshoot`), whatever the number of instances.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::lease::{LeaseConfig, LocalLease, Mode, ModeSwitch};
use floodgate_shared::policy::Quota;
use floodgate_shared::script::TOKEN_BUCKET;
use floodgate_shared::time::Clock;
use floodgate_shared::{Micros, Policy};

use crate::store::{Store, StoreError, lock};

/// Which mode a [`Leaser`] decides in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// Always one script call per request (denials cached).
    Exact,
    /// Always from leases.
    Leased,
    /// Per key: exact until the key turns hot, leased until it cools.
    Auto,
}

/// How one request was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub admitted: bool,
    /// Whether Redis was called for it.
    pub called: bool,
    /// The key's mode when it was decided.
    pub mode: Mode,
    /// The instant it was decided at: Redis' clock when called, else this
    /// instance's.
    pub at: Micros,
}

#[derive(Default)]
struct KeyState {
    switch: ModeSwitch,
    lease: Option<LocalLease>,
    /// Denied locally until then (local clock).
    denied_until: Micros,
    /// Held while a lease is being taken for this key.
    gate: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl KeyState {
    /// The decision this instance can take alone: a cached denial, or a spend from
    /// its lease.
    fn local(&mut self, mode: Mode, now: Micros, cost: u64) -> Option<Outcome> {
        if now < self.denied_until {
            return Some(Outcome {
                admitted: false,
                called: false,
                mode,
                at: now,
            });
        }
        if mode == Mode::Leased && self.lease.as_mut()?.spend(cost, now) {
            return Some(Outcome {
                admitted: true,
                called: false,
                mode,
                at: now,
            });
        }
        None
    }
}

/// Calls and switches so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCounters {
    pub calls: u64,
    pub takes: u64,
    pub returns: u64,
    pub to_leased: u64,
    pub to_exact: u64,
}

/// One instance's lease-mode limiter over `S`.
pub struct Leaser<S, C> {
    store: S,
    clock: C,
    config: LeaseConfig,
    mode: LeaseMode,
    instance: String,
    next_lease: AtomicU64,
    keys: Mutex<HashMap<String, KeyState>>,
    calls: AtomicU64,
    takes: AtomicU64,
    returns: AtomicU64,
    to_leased: AtomicU64,
    to_exact: AtomicU64,
}

impl<S: Store, C: Clock> Leaser<S, C> {
    /// `instance` names this instance's leases (unique per instance).
    pub fn new(store: S, clock: C, config: LeaseConfig, mode: LeaseMode, instance: &str) -> Self {
        Self {
            store,
            clock,
            config,
            mode,
            instance: instance.to_string(),
            next_lease: AtomicU64::new(0),
            keys: Mutex::new(HashMap::new()),
            calls: AtomicU64::new(0),
            takes: AtomicU64::new(0),
            returns: AtomicU64::new(0),
            to_leased: AtomicU64::new(0),
            to_exact: AtomicU64::new(0),
        }
    }

    pub fn counters(&self) -> LeaseCounters {
        LeaseCounters {
            calls: self.calls.load(Ordering::Relaxed),
            takes: self.takes.load(Ordering::Relaxed),
            returns: self.returns.load(Ordering::Relaxed),
            to_leased: self.to_leased.load(Ordering::Relaxed),
            to_exact: self.to_exact.load(Ordering::Relaxed),
        }
    }

    /// The mode `key` is in now (Exact for a key never seen).
    pub fn mode_of(&self, key: &str) -> Mode {
        lock(&self.keys)
            .get(key)
            .map_or(Mode::Exact, |s| s.switch.mode)
    }

    /// Decides one request of `cost` against the bucket `key` of `policy`.
    pub async fn check(&self, key: &str, policy: &Policy) -> Result<Outcome, StoreError> {
        self.check_quota(key, policy.quota(), u64::from(policy.cost()))
            .await
    }

    /// Decides one request of `cost` tokens against the bucket `key`.
    pub async fn check_quota(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Result<Outcome, StoreError> {
        let now = self.clock.now();
        let (mode, give_back, gate) = {
            let mut keys = lock(&self.keys);
            let state = keys.entry(key.to_string()).or_default();
            let before = state.switch.mode;
            let mode = match self.mode {
                LeaseMode::Exact => Mode::Exact,
                LeaseMode::Leased => Mode::Leased,
                LeaseMode::Auto => state.switch.observe(&self.config, now, cost),
            };
            if self.mode != LeaseMode::Auto {
                state.switch.meter.record(now, cost.max(1));
                state.switch.mode = mode;
            }
            match (before, mode) {
                (Mode::Exact, Mode::Leased) => {
                    self.to_leased.fetch_add(1, Ordering::Relaxed);
                }
                (Mode::Leased, Mode::Exact) => {
                    self.to_exact.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            if let Some(o) = state.local(mode, now, cost) {
                return Ok(o);
            }
            // a cooled key gives its live lease back
            let give_back = match mode {
                Mode::Exact => state.lease.take().filter(|l| l.live(now) && l.tokens > 0),
                Mode::Leased => None,
            };
            (mode, give_back, state.gate.clone())
        };
        if let Some(l) = give_back {
            self.give_back(key, quota, &l).await?;
        }
        let burst = quota.burst_window();
        let t = quota.emission_interval();
        let (admitted, redis_now, full_at) = match mode {
            Mode::Exact => {
                self.calls.fetch_add(1, Ordering::Relaxed);
                let args = vec![
                    String::new(),
                    burst.to_string(),
                    (cost as i64 * t).to_string(),
                ];
                let reply = self.store.run_ints(&TOKEN_BUCKET, &[key], &args).await?;
                match reply.as_slice() {
                    [a, n, f] => (*a == 1, *n, *f),
                    other => {
                        return Err(StoreError::protocol(format!(
                            "token bucket reply {other:?}"
                        )));
                    }
                }
            }
            Mode::Leased => {
                // one take per key at a time: the requests arriving meanwhile wait
                // for it instead of each taking a lease of their own
                let _one_take = gate.lock().await;
                let (spent, per_sec) = {
                    let now = self.clock.now();
                    let mut keys = lock(&self.keys);
                    let state = keys.entry(key.to_string()).or_default();
                    if let Some(o) = state.local(mode, now, cost) {
                        return Ok(o);
                    }
                    // a lease spent to its last token is retired by this take
                    let spent = state
                        .lease
                        .take()
                        .filter(|l| l.tokens == 0 && l.live(now))
                        .map(|l| l.member);
                    (spent, state.switch.meter.per_sec(now))
                };
                let want = self.config.lease_size(per_sec);
                let id = format!(
                    "{}.{}",
                    self.instance,
                    self.next_lease.fetch_add(1, Ordering::Relaxed)
                );
                let args = self
                    .config
                    .take_args(None, burst, t, cost, want, &id, spent.as_deref());
                self.calls.fetch_add(1, Ordering::Relaxed);
                self.takes.fetch_add(1, Ordering::Relaxed);
                let sent = self.clock.now();
                let taken = self.store.take_lease(key, &args).await?;
                if taken.leased > 0 {
                    let mut keys = lock(&self.keys);
                    let state = keys.entry(key.to_string()).or_default();
                    // sent at `sent`: the lease ends no later than Redis' expiry
                    state.lease = Some(LocalLease {
                        member: taken.member(&id, t),
                        tokens: taken.leased,
                        until: sent + self.config.lifetime,
                    });
                }
                (taken.admitted, taken.now, taken.full_at)
            }
        };
        if !admitted {
            // room for `cost` again at full_at + cost·T − burst (Redis clock)
            let wait = (full_at.max(redis_now) + cost as i64 * t - burst - redis_now).max(0);
            let mut keys = lock(&self.keys);
            let state = keys.entry(key.to_string()).or_default();
            state.denied_until = state.denied_until.max(now + wait);
        }
        Ok(Outcome {
            admitted,
            called: true,
            mode,
            at: redis_now,
        })
    }

    async fn give_back(&self, key: &str, quota: &Quota, l: &LocalLease) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.returns.fetch_add(1, Ordering::Relaxed);
        let args = vec![
            String::new(),
            quota.emission_interval().to_string(),
            l.member.clone(),
            l.tokens.to_string(),
        ];
        self.store.return_lease(key, &args).await
    }

    /// Gives back every live lease (shutdown).
    pub async fn give_back_all(&self, quotas: impl Fn(&str) -> Option<Quota>) {
        let now = self.clock.now();
        let leases: Vec<(String, LocalLease)> = {
            let mut keys = lock(&self.keys);
            keys.iter_mut()
                .filter_map(|(k, s)| Some((k.clone(), s.lease.take()?)))
                .filter(|(_, l)| l.live(now) && l.tokens > 0)
                .collect()
        };
        for (k, l) in leases {
            if let Some(q) = quotas(&k) {
                let _ = self.give_back(&k, &q, &l).await;
            }
        }
    }
}
