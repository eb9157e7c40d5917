//! How the pipeline behaves: the settings of [`crate::settings::EdgeSettings`]
//! in the pipeline's own units (µs), and the few that no flag sets.

use std::time::Duration;

use floodgate_shared::time::Micros;

use super::events::LogEvent;
use super::leases::LeaseSettings;
use crate::deadline::DeadlineSettings;
use crate::settings::{EdgeSettings, Protocol};

/// How the pipeline behaves. [`Default`]: every default of [`EdgeSettings`] with a
/// global store next to Redis.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// `true`: credentials are `Authorization: Bearer <key>`; `false`: the header
    /// holds the key itself (the host picks the header).
    pub bearer: bool,
    /// How long configuration and key records are cached (µs).
    pub cache_ttl: Micros,
    /// How long a key found not to exist is remembered as such (µs).
    pub negative_cache_ttl: Micros,
    /// How long a known key record and the configuration are used at most before
    /// they are read again, whatever the records' revision says (µs): a writer
    /// that does not bump the revision is still seen.
    pub records_max_age: Micros,
    /// How many of the region's record copies one scan reads ([`super::copies`];
    /// 0: none, one copy at a time).
    pub copies_prefetch: u32,
    /// Most key records cached at once (unknown keys included).
    pub max_cached_keys: usize,
    /// Answer a bucket that just throttled locally until its Retry-After, without
    /// calling the store (see [`super::throttled`]).
    pub throttle_memory: bool,
    /// How long a request waits for one store call: adaptive within a floor and a
    /// ceiling, or fixed (see [`crate::deadline`]); then it gets its policies'
    /// failure mode, and the call goes on in the background. The regional store
    /// has its own, with these settings unless given others.
    pub deadline: DeadlineSettings,
    /// How long the first requests of an instance may wait for its first read of
    /// the configuration (µs), counted from the first one: a store slow to
    /// connect does not turn them into 503s.
    pub startup_wait: Micros,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_threshold: u32,
    /// How long the open breaker keeps requests off the store (µs), before it
    /// health-checks the store.
    pub breaker_cool_down: Micros,
    /// How long an in-flight slot lives unless released (µs): slots of a crashed
    /// instance free themselves then. Longer than the longest request.
    pub in_flight_ttl: Micros,
    /// Lookups that find no key, per client address per minute, before the edge
    /// refuses uncached keys from that address without a lookup (0: no limit).
    pub unknown_keys_per_ip_per_min: u32,
    /// The same budget for the whole instance (0: no limit).
    pub unknown_keys_per_min: u32,
    /// Lease lifetime and the `auto` switch's rates (bounded consistency).
    pub leases: LeaseSettings,
    /// The traffic counters are written at most this often (µs).
    pub stats_flush_every: Micros,
    /// Identical concurrent exact checks share one store call
    /// ([`super::coalesce`]): natively; not in a Worker, whose requests are
    /// separate events (one's call cannot carry another's).
    pub coalesce: bool,
    /// Where breaker transitions and configuration reloads are logged: `tracing`
    /// natively ([`super::events::trace`]), JSON lines on the console in the Worker.
    pub log: fn(&LogEvent<'_>),
}

impl Default for PipelineConfig {
    fn default() -> Self {
        EdgeSettings::default().pipeline(Protocol::Resp)
    }
}

/// How long a store call may run in the background after missing an answer
/// deadline of `deadline`: the store's own (transport) deadline, which hosts give
/// their stores. Long enough for a late reply to be settled (refunded), short
/// enough that an outage leaves few calls behind.
pub fn store_deadline(deadline: Duration) -> Duration {
    (deadline * 20).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// The transport deadline of a store whose answer deadline is `d`: a late call
/// runs on at least to the ceiling, to teach the deadline.
pub fn transport_deadline(d: &DeadlineSettings) -> Duration {
    store_deadline(Duration::from_micros(d.ceiling.max(1) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_call_may_run_for_longer_than_its_answer_deadline() {
        assert_eq!(
            store_deadline(Duration::from_millis(3)),
            Duration::from_secs(1)
        );
        assert_eq!(
            store_deadline(Duration::from_millis(100)),
            Duration::from_secs(2)
        );
        assert_eq!(
            store_deadline(Duration::from_secs(5)),
            Duration::from_secs(10)
        );
    }
}
