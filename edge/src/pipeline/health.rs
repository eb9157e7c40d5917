//! What an instance tells about itself: the running totals behind
//! `GET /__floodgate/health` ([`Health`], for alerting on fail-open duration and
//! volume), each store's breaker and deadline, and the statistics flush that
//! writes the traffic counters to the store, off the request path.

use std::sync::atomic::{AtomicU64, Ordering};

use floodgate_shared::time::{Clock, Micros};

use super::Pipeline;
use super::events::StoreRole;
use super::lane::DeadlineStats;
use crate::breaker::{BreakerStats, Phase};
use crate::stats::StatsField;
use crate::store::{MaybeSend, MaybeSync, Store, StoreError};
use crate::sync::lock;

/// Running totals since the instance started, for alerting (see [`Health`]).
#[derive(Default)]
pub struct Totals {
    pub fail_open: AtomicU64,
    pub fail_closed: AtomicU64,
    pub local_fallback: AtomicU64,
    pub unknown_key_lookups: AtomicU64,
    pub unknown_key_refused: AtomicU64,
    pub late_calls: AtomicU64,
    pub refunds: AtomicU64,
    /// Requests decided from leased tokens while the global store was down.
    pub leased_while_down: AtomicU64,
    /// Leased requests whose tokens were not at hand (decided exactly instead).
    pub lease_misses: AtomicU64,
    /// µs of breaker time already written to `breaker|open_ms`.
    pub open_us_counted: std::sync::Mutex<Micros>,
    pub key_cache_hits: AtomicU64,
    pub key_cache_misses: AtomicU64,
    /// The FNV-1a digest of the configuration in use (0: none yet), so a reload
    /// of the same text is not logged as a new configuration.
    pub config_digest: AtomicU64,
    /// Why the stored configuration was last not used (logged once per reason).
    pub config_problem: std::sync::Mutex<String>,
    /// The store calls out now (the native host polls while there are).
    pub calls_out: std::sync::Arc<super::calls_out::CallsOut>,
    /// The host is stopping ([`Pipeline::start_draining`]).
    pub draining: std::sync::atomic::AtomicBool,
}

/// One instance's view of its store, served as JSON by the hosts
/// (`GET /__floodgate/health`) for alerting on fail-open duration and volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Whether this instance has read its configuration from the global store
    /// yet: `false` for an instance started while its store was unreachable (it
    /// answers 503 with `Retry-After` until then, as a fresh Worker isolate does).
    pub connected: bool,
    /// Whether the instance is stopping: the native host after SIGTERM, for its
    /// drain period (it accepts no new connection and closes each open one
    /// after its next answer). A Worker isolate never is: workerd tells it
    /// nothing before it goes.
    pub draining: bool,
    pub breaker: Phase,
    pub stats: BreakerStats,
    /// Requests answered without Redis, per failure mode, since start: every
    /// answer marked `X-RateLimit-Degraded` (and the 503s of an instance that
    /// could not read its configuration or a key).
    pub fail_open: u64,
    pub fail_closed: u64,
    pub local_fallback: u64,
    /// Key lookups that found no key, and uncached keys refused without a lookup
    /// because their address (or the instance) had spent its budget.
    pub unknown_key_lookups: u64,
    pub unknown_key_refused: u64,
    /// Store calls that missed their answer deadline, and late admissions given
    /// back because their request had been refused.
    pub late_calls: u64,
    pub refunds: u64,
    /// Requests decided from leased tokens (bounded consistency), those decided so
    /// while the global store was down (degraded but bounded), and leased requests
    /// whose tokens were not at hand (decided exactly).
    pub leased: u64,
    pub leased_while_down: u64,
    pub lease_misses: u64,
    /// The global store's deadlines (the current one, expiries slow and silent,
    /// late replies), and the regional store's.
    pub global: DeadlineStats,
    pub regional: Option<DeadlineStats>,
}

impl Health {
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "connected": self.connected,
            "draining": self.draining,
            "breaker": self.breaker.name(),
            "breaker_opened": self.stats.opened,
            "breaker_closed": self.stats.closed,
            "breaker_probes": self.stats.probes,
            "breaker_skipped": self.stats.skipped,
            "degraded_seconds": self.stats.degraded_us as f64 / 1e6,
            "degraded_requests": {
                "fail_open": self.fail_open,
                "fail_closed": self.fail_closed,
                "local_fallback": self.local_fallback,
            },
            "unknown_keys": {
                "lookups": self.unknown_key_lookups,
                "refused": self.unknown_key_refused,
            },
            "late_calls": self.late_calls,
            "refunds": self.refunds,
            "leased": {
                "decisions": self.leased,
                "while_global_down": self.leased_while_down,
                "misses": self.lease_misses,
            },
            "deadline_ms": self.global.deadline_us as f64 / 1e3,
            "deadlines": {
                "global": self.global.to_json(),
                "regional": self.regional.as_ref().map(DeadlineStats::to_json),
            },
        })
        .to_string()
    }
}

impl<S, C> Pipeline<S, C>
where
    S: Store + Clone + MaybeSend + MaybeSync + 'static,
    C: Clock,
{
    /// The phase and counters of each store's breaker: the global store's, and
    /// the regional store's when there is one.
    pub fn breakers(&self) -> Vec<(StoreRole, Phase, BreakerStats)> {
        let now = self.clock.now();
        std::iter::once(&self.global)
            .chain(self.regional.as_ref())
            .map(|g| (g.role(), g.phase(), g.breaker_stats(now)))
            .collect()
    }

    /// Key records found fresh in the cache, and key lookups that went to the
    /// store, since start.
    pub fn key_cache(&self) -> (u64, u64) {
        (
            self.totals.key_cache_hits.load(Ordering::Relaxed),
            self.totals.key_cache_misses.load(Ordering::Relaxed),
        )
    }

    /// The global circuit breaker's counters (transitions, requests kept off the
    /// store, time degraded), for alerting.
    pub fn breaker_stats(&self) -> BreakerStats {
        self.global.breaker_stats(self.clock.now())
    }

    pub fn breaker_phase(&self) -> Phase {
        self.global.phase()
    }

    /// What the global store's deadlines did, and the regional store's.
    pub fn deadline_stats(&self) -> (DeadlineStats, Option<DeadlineStats>) {
        let now = self.clock.now();
        let regional = self.regional.as_ref().map(|r| r.deadline_stats(now));
        (self.global.deadline_stats(now), regional)
    }

    /// The breaker's phase and counters and the degraded totals, for alerting.
    pub fn health(&self) -> Health {
        let t = &self.totals;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (global, regional) = self.deadline_stats();
        Health {
            connected: load(&t.config_digest) != 0,
            draining: t.draining.load(Ordering::Relaxed),
            breaker: self.global.phase(),
            stats: self.breaker_stats(),
            fail_open: load(&t.fail_open),
            fail_closed: load(&t.fail_closed),
            local_fallback: load(&t.local_fallback),
            unknown_key_lookups: load(&t.unknown_key_lookups),
            unknown_key_refused: load(&t.unknown_key_refused),
            late_calls: load(&t.late_calls),
            refunds: load(&t.refunds),
            leased: self.leases.local.load(Ordering::Relaxed),
            leased_while_down: load(&t.leased_while_down),
            lease_misses: load(&t.lease_misses),
            global,
            regional,
        }
    }

    /// Writes the pending traffic counters in one script call, if a flush is due
    /// ([`super::PipelineConfig::stats_flush_every`] since the last). Hosts call
    /// it off the request path: the Worker after each request, the native host
    /// from a timer. While the breaker is not closed the counters wait (bounded)
    /// instead of being lost.
    pub async fn flush_stats(&self) -> Result<(), StoreError> {
        self.flush_if(self.settings.stats_flush_every).await
    }

    /// Hands every count the requests made so far to the statistics' sink (the
    /// instance's metrics): before a scrape. (A flush does it too.)
    pub fn settle_stats(&self) {
        self.stats.settle();
    }

    /// The host is stopping: the health answer says `draining` from now on.
    pub fn start_draining(&self) {
        self.totals.draining.store(true, Ordering::Relaxed);
    }

    /// What a host does last as it stops, once no request will be decided any
    /// more: hands its leases back ([`Pipeline::hand_back`]) and writes the
    /// traffic counts still pending, within `limit` (a store that does not
    /// answer must not hold the stop).
    pub async fn stop(&self, limit: std::time::Duration) {
        let last = async {
            self.hand_back().await;
            let _ = self.flush_pending().await;
        };
        let _ = crate::timer::race(Box::pin(last), limit).await;
    }

    /// Writes whatever is pending now, due or not (tests, and a host stopping).
    pub async fn flush_pending(&self) -> Result<(), StoreError> {
        self.flush_if(0).await
    }

    async fn flush_if(&self, every: Micros) -> Result<(), StoreError> {
        let now = self.clock.now();
        self.count_breaker_time(now);
        if self.global.phase() != Phase::Closed {
            return Ok(());
        }
        match self.stats.take_due(now, every) {
            Some(flush) => {
                let written = self.global.store.write_stats(&flush.write).await;
                if written.is_err() {
                    self.stats.unflushed(&flush);
                }
                written
            }
            None => Ok(()),
        }
    }

    /// Adds the breaker's open time not yet counted to `breaker|open_ms`.
    fn count_breaker_time(&self, now: Micros) {
        let degraded = self.global.breaker_stats(now).degraded_us;
        let mut counted = lock(&self.totals.open_us_counted);
        let ms = (degraded - *counted) / 1_000;
        if ms > 0 {
            *counted += ms * 1_000;
            self.stats.bump(now, StatsField::BreakerOpenMs, ms as u64);
        }
    }
}
